"""Sphinx configuration of the course website; scripts/build_site.py stages the pages and runs Sphinx with it.

Everything the pages load ships in the installed packages (the theme's CSS, JavaScript and fonts, Sphinx's search):
the build and the site need no network. The notebooks are rendered with their committed outputs, never executed.
"""
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
REPOSITORY_URL = PYPROJECT["project"]["urls"]["Repository"]
BRANCH = "main"  # the branch the README's Colab links and the Pages workflow use

project = "Fast deep-learning training with PyTorch Lightning"
html_title = project
author = "the course's authors"
copyright = f"{author} ({PYPROJECT['project']['license']} license)"

extensions = ["myst_nb"]
nb_execution_mode = "off"  # the committed outputs are the lesson's record; the site never re-runs a cell
# A text/markdown output (bench.Table: the lessons' results tables) is read as GitHub-flavoured markdown, as Jupyter
# and Colab read it: its pipes become a table (myst-nb's default, CommonMark, has no tables and prints the pipes)
nb_render_markdown_format = "gfm"
exclude_patterns = ["**/.ipynb_checkpoints"]
# Links to a heading of another page (the lessons' links to docs/glossary.md#roofline) resolve to its anchor
myst_heading_anchors = 2
# which makes MyST check that each page's headings start at '#': a generated results page may start at '###'
suppress_warnings = ["myst.header"]
# ```python fences in the pages highlight as Python; Sphinx's default would guess per block
highlight_language = "python3"

html_theme = "sphinx_book_theme"
html_theme_options = {
    "repository_url": REPOSITORY_URL,
    "repository_branch": BRANCH,
    "path_to_docs": "",  # the staged pages mirror the repository's paths: notebooks/NN.ipynb, docs/results/*.md
    "use_repository_button": True,
    "launch_buttons": {"colab_url": "https://colab.research.google.com"},
    "show_toc_level": 2,
}
html_copy_source = True  # the theme's download button offers each page's source (a lesson's .ipynb) from here
# static/course.css: code and outputs wrap at the text column's edge instead of running past it (tests/test_site.py
# fails on any lesson output or code wider than its column at a laptop's width)
html_static_path = ["static"]
html_css_files = ["course.css"]
html_favicon = "favicon.svg"  # without one, every page's request for /favicon.ico fails
html_show_sourcelink = False
# The theme's light/dark mode for a first visit; left unset, its script logs a console error on every first visit
html_context = {"default_mode": "auto"}
html_last_updated_fmt = None  # a build date would differ between identical builds
