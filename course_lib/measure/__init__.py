"""Measurement: verdicts and their error rates, timing, FLOPs, this machine's ceilings, op counts and the roofline
model. Imports only course_lib.base."""
