"""Sphinx configuration of tfpart's documentation site (built by ``docs/build``).

The pages are MyST markdown; the notebooks of ``notebooks/`` (linked as
``docs/notebooks``) are executed at every build; the CLI reference is read from
:func:`tfpart.cli.build_parser` and the Python API reference from the docstrings of
the names ``tfpart`` exports (``api/toplevel.rst`` is written from ``tfpart._API`` at
each build, so a name added there is documented without editing a page). Warnings are
errors (``-W``) and cross-references are checked (``nitpicky``).
"""
import inspect
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

project = "tfpart"
author = "the tfpart developers"
copyright = "the tfpart developers"  # noqa: A001 (Sphinx's name)

extensions = [
    "myst_nb",  # MyST markdown pages and executed notebooks
    "numpydoc",  # the docstrings' sections
    "sphinx.ext.autodoc",
    "sphinxarg.ext",  # the CLI reference from the argument parser
]

root_doc = "index"
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "notebooks/make_notebooks.py",
                    "screenshots", "benchmarks"]
nitpicky = True
smartquotes = False  # keep the CLI's "--flags" as typed
html_theme = "pydata_sphinx_theme"
html_title = "tfpart"
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2,
                      "secondary_sidebar_items": ["page-toc"]}
html_static_path = []
# no left sidebar on the top-level pages that have no pages under them
html_sidebars = {page: [] for page in ("index", "getting-started", "architecture", "cli",
                                        "benchmarks", "development")}
html_show_sourcelink = False

# MyST: headings get anchors for links like [text](page.md#a-heading)
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]
myst_ref_domains = ["std", "py"]  # not sphinx-argparse's, which cannot resolve them
suppress_warnings = []

# the notebooks: run top to bottom at every build, in their own folder; a cell that
# raises fails the build. TensorFlow's start-up lines on stderr are left out.
# With TFPART_EXECUTED_NOTEBOOKS (a folder where tests/test_notebooks.py wrote the
# notebooks it executed and checked, as CI does), those copies are shown instead of
# executing the notebooks a second time.
EXECUTED_NOTEBOOKS = os.environ.get("TFPART_EXECUTED_NOTEBOOKS")
nb_execution_mode = "off" if EXECUTED_NOTEBOOKS else "force"
nb_execution_timeout = 900
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_output_stderr = "remove"
nb_merge_streams = True

# autodoc and numpydoc
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the docstrings say what arguments are
autodoc_default_options = {"undoc-members": False}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# References that cannot resolve here: the modules below the public API (their names
# appear in docstrings as pointers to the code), and other projects' objects (no
# intersphinx: the build runs offline).
_INTERNAL = r"(tfpart|costmodel|partitioner|rewriters|profiles|examples|benchmarks)(\..*)?"
_EXTERNAL = (r"(tf|tensorflow|keras|np|numpy|nx|networkx|pathlib|os|json|typing|"
             r"collections|dataclasses|scipy|pulp|matplotlib|graphviz|argparse|"
             r"concurrent|subprocess|threading|signal|enum|abc)(\..*)?")
_BUILTIN = (r"(str|int|float|bool|bytes|dict|list|tuple|set|frozenset|object|None|"
            r"Path|callable|Callable|iterable|Iterable|sequence|Sequence|mapping|"
            r"Mapping|optional|array|ndarray|path|file|Exception|ValueError|"
            r"KeyError|OSError|TypeError|RuntimeError)")
nitpick_ignore_regex = [
    (r"py:.*", _INTERNAL),
    (r"py:.*", _EXTERNAL),
    (r"py:.*", _BUILTIN),
]


# the order of the groups on the API page: what a user calls first, first; a module not
# named here comes after these, in alphabetical order
_API_ORDER = ["tfpart.compile", "tfpart.verification", "tfpart.runtime", "tfpart.timing",
              "tfpart.core.plan", "tfpart.core.cluster", "profiles", "tfpart.local_workers",
              "tfpart.servers", "tfpart.picture", "tfpart.plan_diff", "costmodel",
              "costmodel.execution", "costmodel.simulate", "costmodel.gantt",
              "tfpart.training", "tfpart.trainer.loop", "tfpart.checkpoints",
              "tfpart.op_libraries", "tfpart.strategy_request", "tfpart.importers",
              "tfpart.core.errors"]


def _write_toplevel_api(app):
    """``api/toplevel.rst``: every name ``tfpart`` exports, documented under that name
    from its docstring, grouped by the module that defines it."""
    import tfpart

    groups = {module: [] for module in _API_ORDER}
    for name, module in sorted(tfpart._API.items(), key=lambda item: (item[1], item[0])):
        groups.setdefault(module, []).append(name)
    groups = {module: names for module, names in groups.items() if names}
    lines = ["..", "   Written by docs/conf.py from tfpart._API at each build: do not edit.",
             "", "Every name ``tfpart`` exports", "=============================", "",
             ".. currentmodule:: tfpart", "",
             "``import tfpart`` starts nothing: each name below is imported from the module",
             "that defines it when first used. They are documented here under the name",
             "you use, ``tfpart.NAME``; the module is in each group's heading.", ""]
    for module, names in groups.items():
        title = f"From ``{module}``"
        lines += [title, "-" * len(title), ""]
        for name in names:
            obj = getattr(tfpart, name)
            if inspect.ismodule(obj):
                lines += [f".. automodule:: {obj.__name__}", "   :members:", ""]
            elif inspect.isclass(obj):
                lines += [f".. autoclass:: {name}", "   :members:", ""]
            elif callable(obj):
                lines += [f".. autofunction:: {name}", ""]
            else:
                shown = obj.relative_to(ROOT) if isinstance(obj, Path) else obj
                lines += [f".. py:data:: {name}", "",
                          f"   ``{shown}``" + (" (a ``pathlib.Path``)" if isinstance(obj, Path) else ""), ""]
    target = Path(app.srcdir) / "api" / "toplevel.rst"
    text = "\n".join(lines)
    if not target.exists() or target.read_text() != text:
        target.write_text(text)


def _public_name(app, env, node, contnode):
    """A reference to a name ``tfpart`` exports, written with the module that defines
    it (``tfpart.compile.compile_model``, ``tfpart.core.plan.Plan.step_time``, or a bare
    ``verify_batch_sizes`` in a docstring of that module), resolves to its entry under
    ``tfpart.NAME``. A bare name that is not exported is given its module, so that
    ``nitpick_ignore_regex`` sees where it points."""
    if node.get("refdomain") != "py":
        return None
    import tfpart

    from sphinx.util.logging import get_node_location

    target = node.get("reftarget", "")
    source = get_node_location(node) or ""
    if "." not in target and "docstring of " in source:
        documented = source.rsplit("docstring of ", 1)[1].split(":")[0]  # module.function
        module = documented.rsplit(".", 1)[0]
        if module.startswith("tfpart.") and module[len("tfpart."):] in tfpart._API:
            module = tfpart._API[module[len("tfpart."):]]  # documented as tfpart.NAME
        while module and module not in tfpart._API.values() and "." in module:
            module = module.rsplit(".", 1)[0]  # a method's class: back to its module
        target = node["reftarget"] = f"{module}.{target}"
    for name, module in tfpart._API.items():
        canonical = f"{module}.{name}"
        if target == canonical or target.startswith(canonical + "."):
            public = "tfpart." + name + target[len(canonical):]
            domain = env.get_domain("py")
            return domain.resolve_xref(env, node.get("refdoc", ""), app.builder,
                                       node["reftype"], public, node, contnode)
    return None


def _internal_target(app, domain, node):
    """No warning for a bare name in a docstring that :func:`_public_name` found to be
    in a module below the public API (``nitpick_ignore_regex`` sees only the name as
    written)."""
    import re

    return bool(node.get("refdomain") == "py"
                and re.fullmatch(_INTERNAL, node.get("reftarget", "")))


def _executed_copy(app, docname, source):
    """The text of the notebook ``docname`` as the test run executed it, from
    ``EXECUTED_NOTEBOOKS``: a notebook it lacks fails the build (not a stale page)."""
    if EXECUTED_NOTEBOOKS and docname.startswith("notebooks/"):
        copy = Path(EXECUTED_NOTEBOOKS) / (docname.split("/", 1)[1] + ".ipynb")
        if not copy.is_file():
            raise RuntimeError(f"{copy}: no executed copy of {docname} (run "
                               "tests/test_notebooks.py with TFPART_EXECUTED_NOTEBOOKS set)")
        source[0] = copy.read_text()


def setup(app):
    app.connect("source-read", _executed_copy)
    app.connect("warn-missing-reference", _internal_target)
    app.connect("builder-inited", _write_toplevel_api)
    app.connect("missing-reference", _public_name)
