"""Lesson 06: data parallelism by hand, the model of a DDP step, scaling over devices. Imports the layers below."""
