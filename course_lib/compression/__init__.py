"""Lesson 07: int8 quantization, QAT and pruning. Imports the layers below."""
