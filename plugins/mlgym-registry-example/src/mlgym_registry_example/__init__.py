"""An example third-party plugin for mlgym-registry: a JSON action parser and a relative-improvement reward."""
