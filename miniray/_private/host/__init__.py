"""What miniray keeps on this host for every process: session directories and their file
names, process identity (pid + start time). Imports only ``core``."""
