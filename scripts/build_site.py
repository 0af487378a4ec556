"""Build the course website into build/site/ from the committed notebooks, nothing executed: `make site`.

The pages are staged in build/site-src/ with the repository's own paths (notebooks/NN.ipynb, docs/results/*.md), so
relative links between them and the theme's Colab buttons stay right: each lesson gains one line under its title
linking to Colab and to its reference solution, each solution gets a page, and the landing page is drawn from
README.md (the introduction, the quick start's two commands, the lesson table). Sphinx then builds the HTML with
warnings as errors (a broken cross-reference, a missing image or an unreadable notebook stops it), configured by
docs/site/conf.py. tests/test_site.py runs this same script, then opens every page in headless Chromium.
"""
from __future__ import annotations

import json
import shutil
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "docs" / "site"
STAGE = REPO / "build" / "site-src"
SITE = REPO / "build" / "site"
DOCTREES = REPO / "build" / "site-doctrees"
BRANCH = "main"  # the branch the README's Colab links name; docs/site/conf.py uses the same
# The README sections the landing page shows, each up to its first subsection.
README_SECTIONS = ("Quick start", "The lessons")


def repository_url() -> str:
    """The GitHub URL of the course, from pyproject.toml's [project.urls] Repository."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]["Repository"]


def colab_url(notebook: str) -> str:
    """The Colab link that opens a notebook (a repository path such as notebooks/00_setup.ipynb) from GitHub."""
    owner_name = repository_url().removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{owner_name}/blob/{BRANCH}/{notebook}"


def readme_parts(text: str) -> tuple[str, str, dict[str, str]]:
    """(title, introduction, {section: body}) of README.md; a missing section is an error naming it."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# "):
        raise SystemExit("README.md must start with its '# ' title: the website's landing page is drawn from it")
    heads = [i for i, line in enumerate(lines) if line.startswith("## ")] + [len(lines)]
    intro = "\n".join(lines[1:heads[0]]).strip()
    sections = {}
    for start, end in zip(heads, heads[1:]):
        body = lines[start + 1:end]
        cut = next((i for i, line in enumerate(body) if line.startswith("### ")), len(body))
        sections[lines[start][3:].strip()] = "\n".join(body[:cut]).strip()
    missing = [name for name in README_SECTIONS if name not in sections]
    if missing:
        raise SystemExit(f"README.md has no section {missing}: rename README_SECTIONS in scripts/build_site.py to "
                         f"the headings the landing page should show (README has {sorted(sections)})")
    return lines[0][2:].strip(), intro, sections


def toctree(caption: str, entries: list[str], glob: bool = False) -> str:
    """A MyST toctree directive: the site's navigation sidebar is built from these."""
    options = f":caption: {caption}\n:maxdepth: 1\n" + (":glob:\n" if glob else "")
    return "```{toctree}\n" + options + "\n" + "\n".join(entries) + "\n```\n"


def landing_page(lessons: list[str], solutions: list[str]) -> str:
    """index.md: the README's introduction, quick start and lesson table, then the navigation."""
    title, intro, sections = readme_parts((REPO / "README.md").read_text())
    parts = [f"# {title}", intro] + [f"## {name}\n\n{sections[name]}" for name in README_SECTIONS]
    parts.append(f"The [README on GitHub]({repository_url()}#readme) covers the environment, the data, the command "
                 "line and the GPU checks.")
    parts.append(toctree("Lessons", [f"notebooks/{stem}" for stem in lessons]))
    parts.append(toctree("Reference solutions", [f"notebooks/solutions/{stem}" for stem in solutions]))
    parts.append(toctree("Results", ["docs/results/*"], glob=True))
    parts.append(toctree("Guides", ["docs/*"], glob=True))
    return "\n\n".join(parts) + "\n"


def add_links(notebook: dict, stem: str, has_solution: bool) -> None:
    """Put one line under a lesson's title: open in Colab, its reference solution, the notebook on GitHub, the
    glossary."""
    path = f"notebooks/{stem}.ipynb"
    links = [f"[Open in Colab]({colab_url(path)})"]
    if has_solution:
        links.append(f"[Reference solution](solutions/{stem}.md)")
    links.append(f"[Notebook on GitHub]({repository_url()}/blob/{BRANCH}/{path})")
    links.append("[Glossary](../docs/glossary.md)")  # the course's own words, each also linked at its first use
    first = notebook["cells"][0]
    lines = "".join(first["source"]).split("\n")
    if first["cell_type"] != "markdown" or not lines[0].startswith("# "):
        raise SystemExit(f"{path}: the first cell must be markdown starting with the lesson's '# ' title (the site "
                         "puts the Colab and solution links under it)")
    first["source"] = "\n".join([lines[0], "", " · ".join(links), *lines[1:]])


def solution_page(stem: str) -> str:
    """A reference solution's page: the script itself, beside links to its lesson and to GitHub."""
    path = f"notebooks/solutions/{stem}.py"
    return (f"# Reference solution: {stem}\n\nThe exercises of lesson [{stem}](../{stem}.ipynb) solved, as in "
            f"[`{path}`]({repository_url()}/blob/{BRANCH}/{path}).\n\n"
            f"```{{literalinclude}} {stem}.py\n:language: python\n```\n")


def stage() -> int:
    """Write build/site-src/ afresh from the repository; returns the number of lessons staged."""
    shutil.rmtree(STAGE, ignore_errors=True)
    (STAGE / "notebooks" / "solutions").mkdir(parents=True)
    lessons = [p.stem for p in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))]
    if not lessons:
        raise SystemExit("no lessons in notebooks/ (NN_topic.ipynb): nothing to build")
    solutions = [stem for stem in lessons if (REPO / "notebooks" / "solutions" / f"{stem}.py").exists()]
    for stem in lessons:
        notebook = json.loads((REPO / "notebooks" / f"{stem}.ipynb").read_text())
        add_links(notebook, stem, stem in solutions)
        (STAGE / "notebooks" / f"{stem}.ipynb").write_text(json.dumps(notebook))
    for stem in solutions:
        shutil.copy2(REPO / "notebooks" / "solutions" / f"{stem}.py", STAGE / "notebooks" / "solutions")
        (STAGE / "notebooks" / "solutions" / f"{stem}.md").write_text(solution_page(stem))
    # docs/ whole (its pages and what they show or link: a results page's plot, a .jsonl of runs), less this site's
    # own configuration
    shutil.copytree(REPO / "docs", STAGE / "docs")
    shutil.rmtree(STAGE / "docs" / "site")
    (STAGE / "index.md").write_text(landing_page(lessons, solutions))
    return len(lessons)


def main() -> int:
    """Stage the pages, then build build/site/ with Sphinx, warnings as errors; returns Sphinx's exit status."""
    from sphinx.cmd.build import build_main

    stage()
    shutil.rmtree(SITE, ignore_errors=True)  # no page of an earlier build survives a removed source
    shutil.rmtree(DOCTREES, ignore_errors=True)
    return build_main(["-b", "html", "-W", "--keep-going", "-q", "-c", str(CONF_DIR), "-d", str(DOCTREES),
                       str(STAGE), str(SITE)])


if __name__ == "__main__":
    sys.exit(main())
