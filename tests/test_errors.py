"""Usage errors carry the options they are about as data (:class:`explain.errors.Option`), and
each caller words them: the command line as its flags (``str(error)``, what ``explain`` prints),
:func:`explain.ray_data.explain_dataset` as its parameters. The checks run here are the real
ones of ``explain run``, on what they refuse before any model loads."""

import argparse
import ast
import pickle
from pathlib import Path

import pytest

import explain
from explain.batch.explainers import max_memory_option, method_classes, parse_method_options
from explain.batch.options import RunOptions
from explain.batch.ray_stages import check_run
from explain.cli.parser import build_parser
from explain.errors import Option, UsageError, worded
from explain.ray_data import python_message


def _refused(check, *args) -> UsageError:
    with pytest.raises(UsageError) as caught:
        check(*args)
    return caught.value


def test_an_option_is_its_python_name_and_the_command_line_spells_it_as_a_flag():
    assert [Option(name).flag for name in ("max_memory", "methods", "method_options", "trust_model_file")] == [
        "--max-memory", "--method", "--method-option", "--trust-model-file"]
    assert worded(["use ", Option("device"), " cpu"], {"device": "device="}) == "use device= cpu"


def test_the_command_line_wording_is_the_flags_and_the_python_one_the_parameters():
    error = _refused(max_memory_option, "2XB")
    assert error.options == (Option("max_memory"),)
    assert str(error) == "--max-memory 2XB: give a size such as 2GB, 512MiB or 1.5GiB, or a number of bytes"
    assert python_message(error) == "max_memory 2XB: give a size such as 2GB, 512MiB or 1.5GiB, or a number of bytes"
    unknown = _refused(method_classes, ["gradcan"])
    assert str(unknown).startswith("--method: unknown method 'gradcan'")
    assert python_message(unknown).startswith("methods: unknown method 'gradcan'")  # the parameter, plural


def test_options_explain_dataset_does_not_take_keep_their_flags():
    error = _refused(parse_method_options, ["ig:target_layer=features"])
    assert str(error) == ("--method-option ig:target_layer=features: target_layer is set by --layer for all the "
                          "methods; use --layer, not --method-option")
    assert python_message(error) == ("--method-option ig:target_layer=features: target_layer is set by layer for "
                                     "all the methods; use layer, not --method-option")


def test_a_usage_error_crosses_to_the_driver_with_its_options():
    # The Ray engine's model check runs in a worker and returns its usage error pickled: the
    # driver (explain run --engine ray) and explain_dataset word it there, each its own way.
    checked = check_run(RunOptions(inputs=["-"], out="-", max_memory="2XB"))
    assert isinstance(checked, UsageError)
    error = pickle.loads(pickle.dumps(checked))
    assert error.parts == checked.parts and error.options == (Option("max_memory"),)
    assert str(error).startswith("--max-memory 2XB: ") and python_message(error).startswith("max_memory 2XB: ")


def _named_options() -> set[str]:
    """The options that the usage errors below the command line name: ``Option("name")`` in
    ``explain/batch`` and ``explain/models``."""
    package = Path(explain.__file__).parent
    names = set()
    for path in [*(package / "batch").glob("*.py"), *(package / "models").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            named = isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Option"
            if named and isinstance(node.args[0], ast.Constant):  # not Option(option), a computed name
                names.add(node.args[0].value)
    return names


def _command_line_flags(parser: argparse.ArgumentParser) -> dict[str, set[str]]:
    """{an option's Python name (its ``dest``): its long flags}, over every subcommand."""
    flags: dict[str, set[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, flag_set in ((n, f) for sub in action.choices.values()
                                   for n, f in _command_line_flags(sub).items()):
                flags.setdefault(name, set()).update(flag_set)
        elif action.option_strings:
            flags.setdefault(action.dest, set()).update(s for s in action.option_strings if s.startswith("--"))
    return flags


def test_each_option_the_errors_name_is_a_flag_of_the_command_line_as_they_spell_it():
    # Option("max_memmory") would print --max-memmory: every name is a dest of the parser, and
    # the flag str(error) prints is one of that dest's flags.
    named, flags = _named_options(), _command_line_flags(build_parser())
    assert {"max_memory", "methods", "method_options", "target", "out"} <= named  # the search finds them
    wrong = {name: flags.get(name) for name in named if Option(name).flag not in flags.get(name, set())}
    assert not wrong, wrong
