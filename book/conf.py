"""Sphinx configuration of the course's book (``make book``; ``helpers/book.py`` stages the sources and runs Sphinx).

Sphinx + myst-nb + sphinx-book-theme, not Jupyter Book 2: the book is built on the same 2-core CI machine right
after ``make test``, from the notebooks the test suite executed; this stack is pure Python (pip installs it
into the project's venv next to papermill), builds offline and renders stored outputs without a kernel
(``nb_execution_mode = "off"``).  Jupyter Book 2 is the MyST Markdown CLI (``mystmd``), a Node.js program
that needs Node and npm packages on every machine that builds the book.  docs/book.md says more.
"""

project = "distributed-runbook"
author = "distributed-runbook contributors"
root_doc = "index"
extensions = ["myst_nb"]

# The pages: README as index.md, docs/*.md, notebooks/NN_*.ipynb (the executed copies); nothing else.
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

# Notebooks are rendered with the outputs of their real execution; never executed here.
nb_execution_mode = "off"
nb_merge_streams = True            # one block per stream, as in JupyterLab
nb_output_stderr = "show"          # torch's warnings and the ranks' tracebacks are part of the story
nb_ipywidgets_js = {}              # no widget JS from a CDN: the builder widget is replaced by a note (helpers/book.py)
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3           # "#mn2-the-wrong-nic"-style anchors for ## and ### headings

# Every reference must resolve: sphinx-build runs with -W (warnings are errors) and -n (nitpicky).
nitpicky = True
suppress_warnings = ["myst.header"]  # chapters open with "# 01 - ..." and use ## for sections; docs skip levels

html_theme = "sphinx_book_theme"
html_title = "distributed-runbook"
html_static_path = ["_static"]
html_css_files = ["book.css"]
html_copy_source = False           # no _sources/*.ipynb copies (MBs of outputs) in the site
html_show_sourcelink = False
html_last_updated_fmt = None
html_theme_options = {
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "navigation_with_keys": False,
}
