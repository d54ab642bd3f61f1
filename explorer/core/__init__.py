"""Shared leaves every wing may import: units, paths, validation, the environment stamp,
this machine's defaults.  They import nothing from the wings."""
