# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""A ``generate(assistant_model=drafter, ...)`` call's options, resolved once: the ``dflash_*`` arguments it may carry
and what the parts below the decoding loop need of its generation config, as one :class:`DFlashCallOptions`.

The decoding loop reads the generation config here (:func:`call_options`) and nowhere else; the draft policies, the
candidate generator, tree verification and the per-row state take the options. Bad values raise a ValueError naming
the value and the fix, before any work (the routing resolves the call before ``generate`` starts).

Part of the remote-code payload: imports only the standard library.
"""

import dataclasses
from dataclasses import dataclass


# generate() keyword arguments of our own (transformers would refuse them as unused model kwargs): taken out of the
# call by the routing and resolved into DFlashCallOptions for that call.
TREE_BUDGET_KWARG = "dflash_tree_budget"
COMPILE_KWARG = "dflash_compile"
CPU_KERNELS_KWARG = "dflash_cpu_kernels"
DFLASH_GENERATE_KWARGS = ("dflash_policy", TREE_BUDGET_KWARG, "dflash_lookup", COMPILE_KWARG, CPU_KERNELS_KWARG)
DEFAULT_POLICY = "cost"  # when the caller sets neither dflash_policy nor transformers' draft-length settings
DEFAULT_LOOKUP_TOKENS = 10  # the cost-aware policy's prompt-lookup source, unless prompt_lookup_num_tokens says
DRAFT_LENGTH_SCHEDULES = ("constant", "heuristic", "heuristic_transient")
ADAPTIVE_SCHEDULES = ("heuristic", "heuristic_transient")
# what plain generate returns beyond the sequences, read off the generation config as they are named there
OUTPUT_FLAGS = ("return_dict_in_generate", "output_scores", "output_logits", "output_attentions",
                "output_hidden_states")


@dataclass(frozen=True)
class DFlashCallOptions:
    """The options of one generate() call, resolved once; the loop hands them to the parts it builds.

    DFlash's own: `policy`: the name of the draft policy (``policy_dflash.POLICIES``): "cost" (from measured costs;
    plain steps when drafting does not pay), "full" (the whole block, or a constant ``num_assistant_tokens``) or
    "heuristic" (transformers' ``num_assistant_tokens_schedule="heuristic"``, which then rules); `lookup_tokens`: the
    longest prompt-lookup draft the cost-aware policy may verify instead of the drafter's (None: none);
    `branch_tokens`: the longest n-gram branch a tree adds (``prompt_lookup_num_tokens``; None: none); `lookup_ngram`:
    the longest n-gram lookups match (``max_matching_ngram_size``); `tree_budget`: draft nodes of a verified tree
    (None: chains); `compile`: the target's verify forward runs captured (``torch.compile`` at a fixed set of widths on
    a static cache: capture_dflash.py): True (``dflash_compile=True``), False (``dflash_compile=False``, or
    transformers' ``disable_compile=True``) or None (as transformers decides for plain decoding: when a
    ``compile_config`` was given and the device is one it compiles on); `compile_config`: transformers' CompileConfig
    of the call (None: the package's default settings); `cpu_kernels`: on a CPU, the installed package's few-row
    matrix kernel computes the verifies' and drafter reads' linear layers (``kernels_cpu.py``): True
    (``dflash_cpu_kernels=True``), False, or None (the process's ``HF_DFLASH_CPU_KERNELS``; unset: torch's product).

    The generation config's, as generate prepared it: `do_sample`; `num_assistant_tokens` (the most drafts a cycle
    verifies; None: the drafter's whole block); `max_length`: the limit on the text's length in tokens (None: none
    known); `pad_token_id`: what pads finished rows of a batch (generate falls back to the EOS token); and what the
    call returns beyond the sequences (:data:`OUTPUT_FLAGS`).

    Example:
        >>> from transformers import GenerationConfig
        >>> options = resolve_call_options(GenerationConfig(do_sample=True), {"dflash_policy": "full"})
        >>> options.policy, options.lookup_tokens, options.tree_budget, options.do_sample
        ('full', None, None, True)
        >>> resolve_call_options(GenerationConfig(max_length=12)).room(10)  # drafts that fit after 10 tokens
        1
    """

    policy: str = DEFAULT_POLICY
    lookup_tokens: int | None = DEFAULT_LOOKUP_TOKENS
    branch_tokens: int | None = None
    lookup_ngram: int = 2
    tree_budget: int | None = None
    compile: bool | None = False
    compile_config: object | None = None
    cpu_kernels: bool | None = None
    do_sample: bool = False
    num_assistant_tokens: int | None = None
    max_length: int | None = None
    pad_token_id: int | None = None
    return_dict_in_generate: bool = False
    output_scores: bool = False
    output_logits: bool = False
    output_attentions: bool = False
    output_hidden_states: bool = False

    def room(self, length: int) -> int | None:
        """Drafts that fit after a text of `length` tokens under the call's `max_length` (:func:`drafts_that_fit`)."""
        return drafts_that_fit(self.max_length, length)


def drafts_that_fit(max_length: int | None, length: int) -> int | None:
    """Drafts that fit after a text of `length` tokens (the anchor included) under `max_length`; None: no limit.
    The target's token after the drafts needs one place too.

    Example:
        >>> drafts_that_fit(64, 58), drafts_that_fit(None, 58)
        (5, None)
    """
    return None if max_length is None else max_length - length - 1


def call_options(generation_config, resolved: DFlashCallOptions | None = None) -> DFlashCallOptions:
    """The options the decoding loop runs with: `resolved` (what the routing resolved before generate started;
    None: those of `generation_config` alone, as transformers' candidate-generator API builds them), with the
    settings of `generation_config` as generate prepared it for the loop (``max_length`` from ``max_new_tokens``,
    the pad token it fell back to).

    Example:
        >>> from transformers import GenerationConfig
        >>> options = call_options(GenerationConfig(max_length=30), DFlashCallOptions(policy="full"))
        >>> options.policy, options.max_length
        ('full', 30)
    """
    resolved = resolved if resolved is not None else resolve_call_options(generation_config)
    return dataclasses.replace(resolved, **generation_settings(generation_config))


def generation_settings(generation_config) -> dict:
    """The fields of :class:`DFlashCallOptions` that `generation_config` holds (its pad token as generate prepared
    it: ``_pad_token_tensor``)."""
    pad = getattr(generation_config, "_pad_token_tensor", None)
    return dict(
        do_sample=bool(generation_config.do_sample),
        num_assistant_tokens=generation_config.num_assistant_tokens,
        max_length=getattr(generation_config, "max_length", None),
        pad_token_id=None if pad is None else int(pad.reshape(-1)[0]),
        **{flag: bool(getattr(generation_config, flag, False)) for flag in OUTPUT_FLAGS},
    )


def check_positive_int(name: str, value, meaning: str) -> None:
    """`value` must be an int >= 1 (not a bool) or None; `meaning` says what it counts and what None means."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name}={value!r}: {meaning} must be an int >= 1.")


def resolve_call_options(generation_config, arguments: dict | None = None) -> DFlashCallOptions:
    """The call's :class:`DFlashCallOptions` from its ``dflash_*`` `arguments` (plus "assistant_settings": whether the
    caller set transformers' draft-length settings) and its generation config; raises on bad values. The policy's
    name is checked against the policies there are where the call is checked (``checks_dflash``)."""
    arguments = arguments or {}
    lookup = arguments.get("dflash_lookup")
    if lookup is not None and not isinstance(lookup, bool):
        raise ValueError(f"dflash_lookup={lookup!r}: True (the default: the cost-aware policy may verify prompt-lookup "
                         "drafts instead of the drafter's) or False (drafter drafts only).")
    kernels = arguments.get(CPU_KERNELS_KWARG)
    if kernels is not None and not isinstance(kernels, bool):
        raise ValueError(f"{CPU_KERNELS_KWARG}={kernels!r}: True (on a CPU, verifies compute their few rows with "
                         "hf-dflash's matrix kernel), False (torch's matrix product) or None (HF_DFLASH_CPU_KERNELS "
                         "decides; unset: torch's).")
    check_draft_length_settings(generation_config)
    lookup_tokens = getattr(generation_config, "prompt_lookup_num_tokens", None)
    check_positive_int("prompt_lookup_num_tokens", lookup_tokens, "the length of the prompt-lookup drafts")
    budget = arguments.get(TREE_BUDGET_KWARG)
    budget = budget if budget is not None else getattr(generation_config, TREE_BUDGET_KWARG, None)
    check_positive_int(TREE_BUDGET_KWARG, budget, "the draft nodes verified per cycle (None: chains)")
    policy = arguments.get("dflash_policy")
    if generation_config.num_assistant_tokens_schedule in ADAPTIVE_SCHEDULES:
        policy = "heuristic"
    policy = policy or ("full" if arguments.get("assistant_settings") else DEFAULT_POLICY)
    lookup_source = policy == "cost" and lookup is not False
    if budget is None and lookup_tokens and not lookup_source:
        raise ValueError(
            f"prompt_lookup_num_tokens={lookup_tokens} with a DFlash drafter is the length of its prompt-lookup "
            f"drafts: they compete with the drafter's under the default dflash_policy='cost' (with dflash_lookup "
            f"on), or form one more branch of a tree ({TREE_BUDGET_KWARG}=16). This call has neither "
            "(dflash_policy='full', num_assistant_tokens settings or dflash_lookup=False): drop one, or drop "
            "assistant_model for prompt lookup decoding alone."
        )
    return DFlashCallOptions(
        policy=policy,
        compile=compile_choice(generation_config, arguments.get(COMPILE_KWARG)),
        compile_config=getattr(generation_config, "compile_config", None),
        cpu_kernels=kernels,
        lookup_tokens=(lookup_tokens or DEFAULT_LOOKUP_TOKENS) if lookup_source else None,
        branch_tokens=lookup_tokens if budget is not None else None,
        lookup_ngram=getattr(generation_config, "max_matching_ngram_size", None) or 2,
        tree_budget=budget,
        **generation_settings(generation_config),
    )


def compile_choice(generation_config, requested) -> bool | None:
    """Whether the call's verify forward runs captured (see :class:`DFlashCallOptions`'s `compile`): `requested`
    (``dflash_compile``: True, False or None) over transformers' ``disable_compile``, then its ``compile_config``.

    Example:
        >>> from transformers import GenerationConfig
        >>> compile_choice(GenerationConfig(), True), compile_choice(GenerationConfig(), None)
        (True, False)
    """
    if requested is not None and not isinstance(requested, bool):
        raise ValueError(f"{COMPILE_KWARG}={requested!r}: True (capture the target's verify forward with "
                         "torch.compile on a static cache), False (eager) or None (transformers' compile settings).")
    disabled = bool(getattr(generation_config, "disable_compile", False))
    if requested and disabled:
        raise ValueError(f"{COMPILE_KWARG}=True with disable_compile=True: the call asks both to compile and not to; "
                         "drop one of them.")
    if requested is not None or disabled:
        return bool(requested)
    return None if getattr(generation_config, "compile_config", None) is not None else False


def check_draft_length_settings(config) -> None:
    """`num_assistant_tokens` must be a positive int and the schedule one transformers knows."""
    check_positive_int("num_assistant_tokens", config.num_assistant_tokens,
                       "the drafts verified per cycle (or None for the drafter's whole block)")
    schedule = config.num_assistant_tokens_schedule
    if schedule is not None and schedule not in DRAFT_LENGTH_SCHEDULES:
        raise ValueError(
            f"num_assistant_tokens_schedule={schedule!r} is not supported with a DFlash drafter; use one of "
            f"{DRAFT_LENGTH_SCHEDULES} (or None: constant)."
        )
