# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""A drafter on the Hub: loading (with clear errors for broken or foreign checkpoints, and the hand-off to a sibling
drafter class by architecture), saving (serving layout checked, the target named by its Hub id, the model card
written) and uploading exactly what is saved.

Part of the remote-code payload: imports only torch, transformers (and huggingface_hub, which it requires), the
standard library and sibling modules.
"""

import json
import tempfile
from pathlib import Path

from transformers.utils import logging

from .checkpoint_dflash import check_serving_layout, hub_id_of, local_or_cached_config, saved_weight_names
from .configuration_dflash import validate_architecture
from .model_card import render_model_card


logger = logging.get_logger(__name__)
# Sibling drafter classes by the architecture their checkpoints name (DFlash2 registers itself when imported, as
# hf_dflash's __init__ does), so that DFlashDraftModel.from_pretrained loads their checkpoints too
VARIANTS: dict[str, type] = {}


class DFlashHubMixin:
    """`from_pretrained`, `save_pretrained` and `push_to_hub` of a DFlash drafter, over transformers' own."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """Load a DFlash/DFlare drafter (ours, z-lab's, AngelSlim's), or a DFlash2 one (handed to its class, see
        VARIANTS), refusing other architectures clearly.

        Example:
            >>> drafter = DFlashDraftModel.from_pretrained("z-lab/Qwen3-8B-DFlash-b16")  # doctest: +SKIP
        """
        if kwargs.get("config") is None:
            config_file = local_or_cached_config(pretrained_model_name_or_path, kwargs)
            if config_file is not None:
                with open(config_file, encoding="utf-8") as f:
                    architectures = validate_architecture(json.load(f))
                variant = next((VARIANTS[a] for a in architectures if a in VARIANTS), cls)
                if not issubclass(cls, variant):
                    return variant.from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        want_info = kwargs.pop("output_loading_info", False)
        try:
            model, info = super().from_pretrained(
                pretrained_model_name_or_path, *model_args, output_loading_info=True, **kwargs
            )
        except RuntimeError as error:  # size mismatch: the weights do not fit the config
            raise ValueError(
                f"Broken DFlash checkpoint {pretrained_model_name_or_path!s}: weight shapes do not match its "
                f"config.json ({error}). Re-save the drafter with save_pretrained, or fix config.json."
            ) from error
        missing = sorted(k for k in info["missing_keys"] if not k.startswith("rotary_emb"))
        if model.lm_head is not None and "lm_head.weight" not in (saved_weight_names(
                pretrained_model_name_or_path, kwargs) or ()):
            # A draft vocabulary saved before the draft head was (d2t only; or weights we cannot list): it drafts
            # from the target's rows gathered at generate time; save_pretrained asks for them before writing it again
            model.lm_head = None
            logger.info(f"{pretrained_model_name_or_path!s} has a draft vocabulary but no draft lm_head: it drafts "
                        "with the target's rows here; vLLM cannot serve it until it is re-saved with them.")
        elif model.lm_head is not None:
            model.lm_head.requires_grad_(False)  # the target's rows: frozen like the target's head
        if missing:
            raise ValueError(
                f"Broken DFlash checkpoint {pretrained_model_name_or_path!s}: weights missing for {missing[:8]}"
                f"{' ...' if len(missing) > 8 else ''} (expected z-lab names: fc, hidden_norm, norm, layers.N.*). "
                "Re-save the drafter with save_pretrained, or rename the weights to the z-lab names."
            )
        return (model, info) if want_info else model

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Save safetensors weights (z-lab names), config.json with `auto_map`, the flat remote-code files, and a
        README.md model card filled from the MODEL_CARD.md template (target, block size, layer ids, data, tau).

        Example:
            >>> drafter.save_pretrained("my-drafter")  # doctest: +SKIP
            >>> drafter.push_to_hub("me/my-drafter")  # same files, uploaded  # doctest: +SKIP
        """
        check_serving_layout(self.config, None if self.lm_head is None else self.lm_head.weight.shape[0])
        # Config fields name the target by its Hub id, never a folder of the machine that saved it (training runs
        # record the id in training_info when the config holds a local path)
        hub_id = hub_id_of(self.config.target_name_or_path) or hub_id_of(
            (getattr(self, "training_info", None) or {}).get("target")
        )
        if self.config.target_name_or_path and hub_id is None:
            logger.warning_once(
                f"target_name_or_path={self.config.target_name_or_path!r} is a local path, not a Hub id: it is left "
                "out of config.json. Name the target: drafter.config.target_name_or_path = 'org/name'."
            )
        self.config.target_name_or_path = hub_id
        super().save_pretrained(save_directory, *args, **kwargs)
        template = Path(__file__).with_name("MODEL_CARD.md")  # ships with the installed package only
        if template.exists() and kwargs.get("is_main_process", True):
            card = render_model_card(self, template.read_text(encoding="utf-8"), str(save_directory))
            (Path(save_directory) / "README.md").write_text(card, encoding="utf-8")

    def push_to_hub(
        self,
        repo_id: str,
        commit_message: str = "Upload DFlash drafter",
        private: bool | None = None,
        token: str | bool | None = None,
        revision: str | None = None,
        create_pr: bool = False,
        **kwargs,
    ):
        """Upload exactly what `save_pretrained` writes (weights, config, remote code, our model card).

        transformers' own push_to_hub would replace README.md with a generic card, hence this override.

        Example:
            >>> drafter.push_to_hub("me/my-drafter")  # doctest: +SKIP
            >>> AutoModel.from_pretrained("me/my-drafter", trust_remote_code=True)  # doctest: +SKIP
        """
        from huggingface_hub import HfApi

        api = HfApi(token=token)
        repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
        self.hub_repo_id = repo_id  # the model card's usage snippets name the repository
        with tempfile.TemporaryDirectory() as folder:
            self.save_pretrained(folder)
            return api.upload_folder(
                repo_id=repo_id,
                folder_path=folder,
                commit_message=commit_message,
                revision=revision,
                create_pr=create_pr,
            )
