"""The reference pages that follow the code: generated at every build, never committed.

A MkDocs hook (``hooks:`` in ``mkdocs.yml``). At each build it asks the code, in a fresh Python process (so
that ``mkdocs serve`` picks up edits of ``include/tandem``), for

- the command line: ``tandem.cli.build_parser()``, walked subcommand by subcommand, nested ones too;
- the configuration files: ``tandem.config.json_schemas()``, the JSON Schema of ``conf/cluster.yaml`` and of
  ``conf/plans/<name>.yaml`` (what ``tandem config schema`` prints);
- the metrics ``tandem exporter`` serves: ``tandem.monitoring.catalog.METRICS``;

and adds four pages: ``reference/cli.md``, ``reference/cluster-yaml.md``, ``reference/plan-yaml.md`` and
``reference/metrics.md``. It
also turns the reStructuredText roles of the docstrings that mkdocstrings renders on the plan API page
(``:func:`x```, ``:mod:`x```) into plain code.

Run as a script (``python docs/hooks/reference.py``) it prints what the code says as JSON, which is how the
hook reads it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PAGES = {
    "reference/cli.md": "cli",
    "reference/cluster-yaml.md": "cluster.yaml",
    "reference/plan-yaml.md": "plans/<name>.yaml",
    "reference/metrics.md": "metrics",
}
HELP_WIDTH = "100"


# --- what the code says (run in a child process) -------------------------------------------------------------


def _describe_parser(parser: Any, path: list[str], help_text: str | None) -> dict[str, Any]:
    import argparse

    node: dict[str, Any] = {"path": path, "help": help_text, "description": parser.description,
                            "usage": parser.format_usage().strip(), "arguments": [], "commands": []}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                node["commands"].append(_describe_parser(sub, [*path, name], helps.get(name)))
            continue
        default = action.default
        node["arguments"].append({
            "options": list(action.option_strings),
            "dest": action.dest,
            "metavar": action.metavar if isinstance(action.metavar, str) else None,
            "nargs": action.nargs if isinstance(action.nargs, (str, int)) else None,
            "choices": [str(c) for c in action.choices] if action.choices is not None else None,
            "default": None if default in (None, argparse.SUPPRESS) or isinstance(action, (
                argparse._StoreTrueAction, argparse._StoreFalseAction)) else str(default),
            "help": None if action.help == argparse.SUPPRESS else action.help,
            "required": bool(action.required),
            "flag": isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                                        argparse._StoreConstAction, argparse._CountAction)),
            "repeatable": isinstance(action, (argparse._AppendAction, argparse._CountAction)),
        })
    return node


def _models(model: Any, found: dict[str, Any]) -> dict[str, Any]:
    """Every pydantic model reachable from ``model`` through its fields' annotations, by class name."""
    import typing

    from pydantic import BaseModel

    def walk(annotation: Any) -> None:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation.__name__ not in found:
                _models(annotation, found)
            return
        for argument in typing.get_args(annotation):
            walk(argument)

    found[model.__name__] = model
    for info in model.model_fields.values():
        walk(info.annotation)
    return found


def attribute_docstrings(model: Any) -> dict[str, str]:
    """The docstrings under a model's fields (``x: int = 1`` then ``\"\"\"...\"\"\"``), by YAML name (the alias)."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(model)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    out = {}
    for statement, following in zip(body, body[1:]):
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and \
                isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant) and \
                isinstance(following.value.value, str):
            info = model.model_fields.get(statement.target.id)
            if info is not None:
                out[info.alias or statement.target.id] = inspect.cleandoc(following.value.value)
    return out


def code_facts() -> dict[str, Any]:
    """The parser of ``tandem`` and the configuration files' JSON Schemas, as plain data.

    A field's docstring (pydantic leaves them out of the schema) becomes its ``description``.
    """
    os.environ["COLUMNS"] = HELP_WIDTH  # argparse wraps usage lines to the terminal's width
    from tandem.cli import build_parser
    from tandem.config import ClusterFile, PlanFile, json_schemas

    schemas = json_schemas()
    models = _models(PlanFile, _models(ClusterFile, {}))
    for schema in schemas.values():
        for name, definition in [(schema.get("title"), schema), *schema.get("$defs", {}).items()]:
            documented = attribute_docstrings(models[name]) if name in models else {}
            for key, prop in definition.get("properties", {}).items():
                if key in documented and not prop.get("description"):
                    prop["description"] = documented[key]
    from dataclasses import asdict

    from tandem.monitoring.catalog import METRICS

    return {"cli": _describe_parser(build_parser(), ["tandem"], None), "schemas": schemas,
            "metrics": [asdict(metric) for metric in METRICS]}


# --- Markdown ----------------------------------------------------------------------------------------------


_ROLE = re.compile(r":(?:func|mod|class|data|meth|attr|exc|obj|ref):`~?([^`]+)`")
_DOUBLE_BACKTICKS = re.compile(r"``(.+?)``", re.DOTALL)


def rst_to_markdown(text: str | None) -> str:
    """Docstring text (reStructuredText-ish) as Markdown: ``x`` and :role:`x` become `x`."""
    if not text:
        return ""
    text = _ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    return _DOUBLE_BACKTICKS.sub(lambda m: "`" + m.group(1).replace("`", "'") + "`", text)


def cell(text: str | None) -> str:
    """Text for one cell of a Markdown table: one line, pipes outside code escaped (a pipe inside code does not
    split a cell)."""
    parts = " ".join(rst_to_markdown(text).split()).split("`")
    return "`".join(part if index % 2 else part.replace("|", "\\|") for index, part in enumerate(parts))


def sentence(text: str) -> str:
    """A help string as a sentence: capitalised, one full stop."""
    text = cell(text).rstrip(".")
    return text[:1].upper() + text[1:] + "."


def code(text: str) -> str:
    """Inline code that may hold backticks (a pipe inside code does not split a table's cell)."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


# ... the command line


def _argument_name(argument: dict[str, Any]) -> str:
    if argument["options"]:
        names = ", ".join(argument["options"])
        if argument["flag"]:
            return names
        value = argument["metavar"] or (
            "{" + ",".join(argument["choices"]) + "}" if argument["choices"] else argument["dest"].upper())
        return f"{names} {value}"
    return argument["metavar"] or argument["dest"]


def _command_section(node: dict[str, Any], level: int) -> list[str]:
    name = " ".join(node["path"])
    anchor = "-".join(node["path"])
    lines = [f"{'#' * level} `{name}` {{#{anchor}}}", ""]
    if node["help"]:
        lines += [sentence(node["help"]), ""]
    if node["description"] and node["description"] != node["help"] and level > 1:
        lines += [rst_to_markdown(node["description"]), ""]
    lines += ["```text", node["usage"], "```", ""]
    if node["arguments"]:
        lines += ["| argument | default | what |", "|---|---|---|"]
        for argument in node["arguments"]:
            what = cell(argument["help"])
            extras = []
            if argument["choices"] and argument["options"] and argument["metavar"]:
                extras.append("one of " + ", ".join(code(c) for c in argument["choices"]))
            elif argument["choices"] and not argument["options"]:
                extras.append("one of " + ", ".join(code(c) for c in argument["choices"]))
            if argument["required"] and argument["options"]:
                extras.append("required")
            if argument["nargs"] == "?" and not argument["options"]:
                extras.append("optional")
            if argument["repeatable"] and "repeatable" not in what:
                extras.append("repeatable")
            if extras:
                what = f"{what} ({'; '.join(extras)})" if what else "; ".join(extras).capitalize()
            default = code(argument["default"]) if argument["default"] not in (None, "") else ""
            lines.append(f"| {code(_argument_name(argument))} | {default} | {what} |")
        lines.append("")
    for sub in node["commands"]:
        lines += _command_section(sub, level + 1)
    return lines


def cli_page(cli: dict[str, Any]) -> str:
    """``reference/cli.md``: every command of ``tandem``, from its argparse parser."""
    commands = cli["commands"]
    lines = [
        "# Command line",
        "",
        "!!! note \"Generated from the code\"",
        "    This page is built from `tandem.cli.build_parser()` at every build of the site "
        "(`docs/hooks/reference.py`): it lists exactly the commands and options `tandem` takes. "
        "`tandem <command> --help` prints the same.",
        "",
        "Run `tandem` from the project root with the environment of `.tandem/env.sh` "
        "(`. .tandem/env.sh`). A Tandem error (a refused configuration, request or name) is one line on "
        "standard error and exit status 2; so is a usage error (`error: tandem query: argument --since: …`).",
        "",
        "## Commands",
        "",
        "| command | what |",
        "|---|---|",
        *[f"| [`tandem {c['path'][-1]}`](#{'-'.join(c['path'])}) | {cell(c['help'])} |" for c in commands],
        "",
        "## Summary",
        "",
        "The parser's own description (`tandem --help`):",
        "",
        "```text",
        _DOUBLE_BACKTICKS.sub(lambda m: m.group(1), (cli["description"] or "").strip("\n")),
        "```",
        "",
    ]
    for node in commands:
        lines += _command_section(node, 2)
    return "\n".join(lines)


# ... the configuration files

_UNITS = ((86400.0, "day"), (3600.0, "hour"), (60.0, "minute"), (1.0, "second"))


def human_duration(seconds: float) -> str:
    """``86400.0`` → ``1 day``, ``0.5`` → ``500 ms``: a duration as a YAML file would say it."""
    for size, unit in _UNITS:
        if seconds >= size and (seconds / size).is_integer():
            count = int(seconds / size)
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{round(seconds * 1000)} ms" if seconds < 1 else f"{seconds:g} seconds"


def _is_duration(schema: dict[str, Any]) -> bool:
    """Whether a property is a ``Duration`` (``tandem.declarations``): a string such as '2 seconds' or seconds."""
    return "anyOf" in schema and "duration" in (schema.get("description") or "")


def _optional_duration(schema: dict[str, Any]) -> bool:
    return "anyOf" in schema and any(_is_duration(o) for o in schema["anyOf"])


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


class SchemaPage:
    """One configuration file's JSON Schema as sections: the file's keys, then each nested object by its YAML path."""

    def __init__(self, file: str, schema: dict[str, Any], prefix: str) -> None:
        self.file = file
        self.schema = schema
        self.defs = schema.get("$defs", {})
        self.prefix = prefix
        self.paths: dict[str, str] = {}  # definition -> the YAML path it is first met at
        self.order: list[str] = []
        self._visit(schema, "")

    def anchor(self, definition: str) -> str:
        return f"{self.prefix}-{definition.lower()}"

    def _children(self, schema: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
        """``(path, schema)`` of every object reachable one step down from ``schema``."""
        out = []
        for name, prop in schema.get("properties", {}).items():
            out += self._within(prop, f"{path}.{name}" if path else name)
        return out

    def _within(self, schema: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
        if "$ref" in schema:
            return [(path, schema)]
        out = []
        for option in schema.get("anyOf", []):
            out += self._within(option, path)
        if isinstance(schema.get("additionalProperties"), dict):
            out += self._within(schema["additionalProperties"], f"{path}.<name>")
        if isinstance(schema.get("items"), dict):
            out += self._within(schema["items"], f"{path}[]")
        return out

    def _visit(self, schema: dict[str, Any], path: str) -> None:
        for child_path, child in self._children(schema, path):
            name = _ref_name(child["$ref"])
            if name in self.paths:
                continue
            self.paths[name] = child_path
            self.order.append(name)
            self._visit(self.defs[name], child_path)

    def type_of(self, schema: dict[str, Any]) -> str:
        if "$ref" in schema:
            name = _ref_name(schema["$ref"])
            return f"[`{self.paths[name]}`](#{self.anchor(name)})"
        if _is_duration(schema):
            return "duration"
        if "anyOf" in schema:
            options = [o for o in schema["anyOf"] if o.get("type") != "null"]
            names = list(dict.fromkeys(self.type_of(o) for o in options))
            if "integer" in names and "number" in names:
                names.remove("integer")
            return " or ".join(names) + (" or null" if len(options) < len(schema["anyOf"]) else "")
        if "const" in schema:
            return code(json.dumps(schema["const"]))
        if "enum" in schema:
            return "one of " + ", ".join(code(str(v)) for v in schema["enum"])
        kind = schema.get("type")
        if kind == "array":
            items = schema.get("items", {})
            return f"list of {self.type_of(items)}" if items else "list"
        if kind == "object":
            values = schema.get("additionalProperties")
            if isinstance(values, dict):
                return f"map of name → {self.type_of(values)}"
            return "object"
        return {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean"}.get(kind, kind or "any")

    @staticmethod
    def constraints(schema: dict[str, Any]) -> list[str]:
        found = []
        if schema.get("minItems") == 1 or schema.get("minProperties") == 1:
            found.append("not empty")
        for key, text in (("minimum", "≥ {}"), ("exclusiveMinimum", "> {}"), ("maximum", "≤ {}"),
                          ("exclusiveMaximum", "< {}"), ("minLength", "at least {} characters"),
                          ("maxLength", "at most {} characters"), ("minItems", "at least {} items"),
                          ("maxItems", "at most {} items"), ("minProperties", "at least {} entries"),
                          ("pattern", "matches {}")):
            if key in schema and not (key in ("minItems", "minProperties") and schema[key] == 1):
                value = code(schema[key]) if key == "pattern" else schema[key]
                found.append(text.format(value))
        if not _is_duration(schema):
            for option in schema.get("anyOf", []):
                found += SchemaPage.constraints(option)
        for nested in ("items", "additionalProperties"):
            if isinstance(schema.get(nested), dict) and "$ref" not in schema[nested]:
                found += [f"each {c}" for c in SchemaPage.constraints(schema[nested])]
        return found

    def default_of(self, schema: dict[str, Any]) -> str:
        if "default" not in schema:
            return ""
        value = schema["default"]
        if value is None:
            return "none"
        if (_is_duration(schema) or _optional_duration(schema)) and isinstance(value, (int, float)):
            return code(human_duration(float(value)))
        if "$ref" in schema or isinstance(value, dict) and len(json.dumps(value)) > 40:
            return "see below" if "$ref" in schema else code(json.dumps(value))
        return code(json.dumps(value))

    def table(self, schema: dict[str, Any]) -> list[str]:
        required = set(schema.get("required", []))
        lines = ["| key | type | default | notes |", "|---|---|---|---|"]
        for name, prop in schema.get("properties", {}).items():
            notes = []
            if name in required:
                notes.append("**required**")
            notes += self.constraints(prop)
            description = prop.get("description")
            if description and not _is_duration(prop):
                notes.append(cell(description))
            default = "" if name in required else self.default_of(prop)
            lines.append(f"| `{name}` | {self.type_of(prop)} | {default} | {'; '.join(str(n) for n in notes)} |")
        return lines

    def markdown(self, title: str, intro: list[str]) -> str:
        lines = [f"# {title}", "", *intro, "", f"## The file {{#{self.prefix}-file}}", "",
                 rst_to_markdown(self.schema.get("description")), "", *self.table(self.schema), ""]
        for name in self.order:
            definition = self.defs[name]
            lines += [f"## `{self.paths[name]}` {{#{self.anchor(name)}}}", ""]
            if definition.get("description"):
                lines += [rst_to_markdown(definition["description"]), ""]
            lines += [*self.table(definition), ""]
        return "\n".join(lines)


_SCHEMA_NOTE = [
    '!!! note "Generated from the code"',
    "    This page is built from the pydantic models of `tandem.config` and `tandem.declarations` at every "
    "build of the site (`docs/hooks/reference.py`, from `tandem.config.json_schemas()`, what `tandem config "
    "schema` prints). Durations are written `500 ms`, `2 seconds`, `3 minutes`, `1 hour`, `1 day`, or as a "
    "number of seconds. Unknown keys are refused, and so is a key given twice.",
]


def schema_page(file: str, schema: dict[str, Any]) -> str:
    if file == "cluster.yaml":
        return SchemaPage(file, schema, "cluster").markdown("cluster.yaml", [
            *_SCHEMA_NOTE, "",
            "`conf/cluster.yaml` says where data lives, which PostgreSQL coordinates, where Airflow's API is, the "
            "nodes and the messaging layer. Environment variables override some of it "
            "([Set-up](../getting-started/setup.md#environment-variables)); how the files are checked: "
            "[Configuration files](../getting-started/configuration.md)."])
    return SchemaPage(file, schema, "plan").markdown("Plan YAML", [
        *_SCHEMA_NOTE, "",
        "`conf/plans/<name>.yaml` declares one plan: its streams, execution groups, outputs, nodes and policies. "
        "[Writing a plan](../plans.md) explains them; this page lists every key."])


# --- the hook ----------------------------------------------------------------------------------------------


def _facts() -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              filter(None, [str(ROOT / "include"), os.environ.get("PYTHONPATH")]))})
    if done.returncode != 0:
        raise RuntimeError(f"docs/hooks/reference.py: cannot read the CLI and the configuration schema from the "
                           f"code:\n{done.stderr.strip()}")
    return json.loads(done.stdout)


def metrics_page(metrics: list[dict[str, Any]]) -> str:
    """Every metric of ``tandem exporter``: name, type, labels and what it says."""
    lines = ["# Metrics", "",
             "Generated from `tandem.monitoring.catalog` at every build: what `tandem exporter` serves at `/metrics`",
             "([Monitoring](../operating/monitoring.md) says how to run it). `plan_instance` is a plan's instance",
             "(`instance` and `job` are the labels Prometheus gives the exporter's target).", "",
             "| Metric | Type | Labels | What it says |", "|---|---|---|---|"]
    for metric in metrics:
        labels = ", ".join(f"`{label}`" for label in metric["labels"]) or "–"
        lines.append(f"| `{metric['name']}` | {metric['type']} | {labels} | {cell(metric['help'])} |")
    return "\n".join(lines) + "\n"


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    facts = _facts()
    for src_uri, what in PAGES.items():
        if what == "cli":
            content = cli_page(facts["cli"])
        elif what == "metrics":
            content = metrics_page(facts["metrics"])
        else:
            content = schema_page(what, facts["schemas"][what])
        files.append(File.generated(config, src_uri, content=content))
    return files


_RENDERED_ROLE = re.compile(r":(?:func|mod|class|data|meth|attr|exc|obj):(?=<code>|<a )")


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """mkdocstrings renders ``:func:`x``` as ``:func:<code>x</code>``: keep the code, drop the role."""
    return _RENDERED_ROLE.sub("", html) if page.file.src_uri.startswith("reference/") else html


if __name__ == "__main__":
    json.dump(code_facts(), sys.stdout)
