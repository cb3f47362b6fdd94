"""The package's meeting points with other libraries' internals, one room per library (``torchrl/``): what relies
on a library's private names, its worker loops or its versions lives there and nowhere else."""
