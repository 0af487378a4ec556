"""The base layer: errors, files, the private-API home, the machine classes and this machine, the lesson specs, the
run size and paths, the results files. Imports nothing else of course_lib."""
