"""The trainer extension point: listing and describing trainers imports no TRL; loading one imports it.

Runs on a core install: the trainer of our own here is plain Python.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

from factory.errors import ConfigError
from factory.trainers import TRAINERS, TrainerEntry, load_trainer, register_trainer, trainer_entry, trainer_names

HERE = __name__


@dataclass
class EchoConfig:
    """A trainer config of our own."""

    data: str = "train.jsonl"


def train_echo(config: EchoConfig) -> str:
    """A 'training' that reports what it would train on."""
    return f"trained on {config.data}"


ECHO = TrainerEntry("echo", f"{HERE}:EchoConfig", f"{HERE}:train_echo", "sft", "Echo the data path (a test).")


@pytest.fixture
def echo_trainer(monkeypatch):
    monkeypatch.setattr(TRAINERS, "_entries", dict(TRAINERS._entries))  # registered for this test only
    register_trainer(ECHO)


def test_the_built_in_trainers_are_registered():
    assert trainer_names() == sorted(["dpo", "kto", "sft", "reward", "grpo", "hint", "rw-sft", "span-kto"]) == (
        TRAINERS.names())
    dpo = trainer_entry("dpo")
    assert (dpo.name, dpo.reads) == ("dpo", "dpo") and dpo.config.endswith(":DPOConfig") and dpo.summary


def test_listing_and_describing_trainers_imports_no_trl():
    code = ("import sys\nfrom factory.trainers import trainer_entry, trainer_names\n"
            "[trainer_entry(n).summary for n in trainer_names()]\n"
            "print(sorted(m for m in ('torch', 'trl', 'transformers') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_trainer_of_our_own_is_listed_and_loaded_by_name(echo_trainer):
    assert "echo" in trainer_names() and trainer_entry("echo") is ECHO
    config_class, train, entry = load_trainer("echo")
    assert (config_class, train, entry) == (EchoConfig, train_echo, ECHO)
    assert train(config_class(data="pairs.jsonl")) == "trained on pairs.jsonl"


def test_registering_again_replaces(echo_trainer):
    register_trainer(TrainerEntry("echo", ECHO.config, ECHO.train, "dpo", "Replaced."))
    assert trainer_entry("echo").summary == "Replaced." and trainer_names().count("echo") == 1


def test_a_trainer_whose_module_is_missing_names_the_extra(monkeypatch):
    monkeypatch.setattr(TRAINERS, "_entries", dict(TRAINERS._entries))
    register_trainer(TrainerEntry("ghost", "no_such_trainer_module:Config", "no_such_trainer_module:train", "sft",
                                  "Needs a module that is not installed."))
    with pytest.raises(ConfigError, match=r"needs the 'train' extra \(no_such_trainer_module is missing\)"):
        load_trainer("ghost")


def test_unknown_trainers_list_the_registered_ones():
    with pytest.raises(ConfigError, match=r"unknown trainer 'nope' \(use one of: dpo, grpo, hint, kto, reward, "
                                          r"rw-sft, sft, span-kto\)"):
        trainer_entry("nope")
    with pytest.raises(ConfigError, match="unknown trainer 'nope'"):
        load_trainer("nope")
