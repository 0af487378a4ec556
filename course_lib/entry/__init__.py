"""The entry points: `python -m course_lib` (LightningCLI, its run folder and arguments) and `python -m
course_lib.entry.runner` (every lesson). Nothing below imports them."""
