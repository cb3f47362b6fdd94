"""The TorchRL transforms of the chain ``make`` builds, one module per stage."""
