"""Typed experiment configuration: the schema, presets and overrides, validation and the run's identity.

Loads no torch: every command checks its config (and its flags) before torch, Ray or MLflow start.
``choices`` holds every closed set of values; ``run_identity`` the fields that define a run and their digest;
``hardware``, ``addresses`` and ``manifest`` turn a config's device, addresses and identity into what a run
uses.
"""

from mocolab.config.choices import CHOICES, PLACEMENTS
from mocolab.config.run_identity import (RESUMABLE_FIELDS, ConfigMismatchError, check_same_config,
                                         config_diff, fingerprint, identity)
from mocolab.config.io import (PATH_FIELDS, PRESET_DIR, absolute_paths, apply_overrides, build_config,
                               config_file_overrides, from_dict, list_presets, load_preset, parse_overrides,
                               preset_summary, to_yaml, with_absolute_paths)
from mocolab.config.schema import (AugmentConfig, BankConfig, Config, DataConfig, EvalConfig, ModelConfig,
                                   MethodConfig, MocoConfig, OptimConfig, QueueConfig, RunConfig, VitConfig,
                                   departures)
from mocolab.config.validate import NAME_RULE, check_name, check_train_size, validate

__all__ = ["CHOICES", "NAME_RULE", "PATH_FIELDS", "PLACEMENTS", "PRESET_DIR", "RESUMABLE_FIELDS", "AugmentConfig",
           "BankConfig", "Config", "ConfigMismatchError", "DataConfig", "EvalConfig", "MethodConfig", "ModelConfig",
           "MocoConfig", "OptimConfig", "QueueConfig", "RunConfig", "VitConfig", "absolute_paths", "apply_overrides",
           "build_config", "check_name", "check_same_config", "check_train_size", "config_diff",
           "config_file_overrides", "departures", "fingerprint", "from_dict", "identity", "list_presets",
           "load_preset", "parse_overrides", "preset_summary", "to_yaml", "validate", "with_absolute_paths"]
