"""course_lib: the LightningModules, DataModules and helpers behind the fast-training course's notebooks."""
from .base.config import REPO_URL, run_size

__version__ = "0.1.0"
__all__ = ["REPO_URL", "run_size", "__version__"]
