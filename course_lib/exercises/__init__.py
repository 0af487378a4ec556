"""The lessons' exercises: `from course_lib import exercises`, then in a CHECK cell
`passed = exercises.check_02_trainer(trainer_settings)`; warm-up answers through `exercises.warmups`.

core.py grades (a Grading object: mechanism without a clock, then alternating measured rounds; nothing kept between
checks unless the caller holds the Grading) and probes the learner's code (forbidden calls, torch calls); cells.py
finds the EXERCISE/CHECK cells, starters and solutions; one module per kind of lever holds its lessons' checks:
predict.py (00), training.py (01-02), datapath.py (03, 08), compute.py (04-05), allreduce.py (06), inference.py (07)."""
from . import warmups
from .allreduce import check_06_allreduce
from .cells import exercise_cells, notebooks_folder, solution, starter
from .compute import check_04_activation_memory, check_05_fusion
from .core import Grade, Grading, forbidden, torch_calls
from .datapath import check_03_data_wait, check_08_batch_augment
from .inference import check_07_inference
from .predict import check_00_prediction
from .training import check_01_batching, check_02_trainer

__all__ = ["Grade", "Grading", "check_00_prediction", "check_01_batching", "check_02_trainer", "check_03_data_wait",
           "check_04_activation_memory", "check_05_fusion", "check_06_allreduce", "check_07_inference",
           "check_08_batch_augment", "exercise_cells", "forbidden", "notebooks_folder", "solution", "starter",
           "torch_calls", "warmups"]
