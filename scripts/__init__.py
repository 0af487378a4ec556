"""The repository's own tools, run from the checkout's root as modules: `python -m scripts.NAME` (the GPU checks, the
GPU estimates, the recipe-fidelity checks beside the held-out ports, the website). A package, not part of course_lib:
the wheel (and Colab's install) ships only the course; these need a checkout, and the ports must stay apart from the
code they check. Run as modules, they import course_lib from the checkout and each other as `scripts.NAME`, with no
sys.path edits."""
