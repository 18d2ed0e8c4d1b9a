"""Usage errors carry the options they are about as data (:class:`explain.errors.Option`), and
each caller words them: the command line as its flags (``str(error)``, what ``explain`` prints),
:func:`explain.ray_data.explain_dataset` as its parameters. The checks run here are the real
ones of ``explain run``, on what they refuse before any model loads."""

import pickle

import pytest

from explain.batch.explainers import max_memory_option, method_classes, parse_method_options
from explain.batch.options import RunOptions
from explain.batch.ray_stages import check_run
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
