import pytest
from pydantic import ValidationError

from scheduler.config import PolicyConfig, env_value, env_var_name


def test_f_is_derived_from_the_concurrency_limit_and_logged_in_the_seeds_wording():
    cfg = PolicyConfig(max_running_requests=10, chunk_budget_tokens=8192)
    assert cfg.prefill_concurrency == 20
    assert cfg.cap_tokens == 409
    assert cfg.describe_cap() == "Prefill concurrency N=20: long_prefill_token_threshold=409"


def test_f_follows_the_concurrency_limit():
    assert PolicyConfig(max_running_requests=4, chunk_budget_tokens=8192).cap_tokens == 1024


def test_explicit_f_overrides_the_derivation():
    cfg = PolicyConfig(per_request_cap_tokens=2048)
    assert cfg.cap_tokens == 2048
    assert "set explicitly" in cfg.describe_cap()


def _other_valid_value(name: str, default: object) -> object:
    """A valid value other than the default, for any knob."""
    if isinstance(default, bool):
        return not default
    if name in ("pass_throughput_slack", "pass_overrun_quantile"):
        return 0.25  # fractions
    if default is None:
        return 1024  # the optional token knobs: a pass size or a cap within the default chunk budget
    if name == "chunk_budget_tokens":
        return default * 2  # stays above the pass sizes it bounds
    if name == "tenant_weights":
        return {"acme": 2.0, "lab": 0.5}
    assert isinstance(default, int | float), name
    return default + 1


def test_every_knob_has_an_environment_override(monkeypatch):
    expected = {}
    for name, field in PolicyConfig.model_fields.items():
        expected[name] = _other_valid_value(name, field.get_default(call_default_factory=True))
        monkeypatch.setenv(env_var_name(name), env_value(expected[name]))
    assert PolicyConfig().model_dump() == expected
    assert env_var_name("diagnostics") == "FAIRSHARE_DIAGNOSTICS"


def test_bad_environment_value_names_the_field(monkeypatch):
    monkeypatch.setenv("FAIRSHARE_LOOKAHEAD", "-1")
    with pytest.raises(ValidationError, match="lookahead"):
        PolicyConfig()


def test_zero_chunk_budget_is_refused():
    with pytest.raises(ValidationError, match="chunk_budget_tokens"):
        PolicyConfig(chunk_budget_tokens=0)


def test_pass_budgets_cannot_exceed_the_chunk_budget():
    with pytest.raises(ValidationError, match="quiet_pass_tokens=9000 exceeds chunk_budget_tokens=8192"):
        PolicyConfig(quiet_pass_tokens=9000)


def test_unknown_field_is_refused():
    with pytest.raises(ValidationError, match="skip_ahaed"):
        PolicyConfig(skip_ahaed=True)


def test_with_overrides_validates_and_keeps_the_rest():
    cfg = PolicyConfig(lookahead=5).with_overrides(fair_share=False)
    assert (cfg.lookahead, cfg.fair_share) == (5, False)
    with pytest.raises(ValidationError):
        cfg.with_overrides(lookahead="many")


def test_empty_variable_means_unset_and_none_clears_an_optional_knob(monkeypatch):
    monkeypatch.setenv("FAIRSHARE_LOOKAHEAD", "")
    monkeypatch.setenv("FAIRSHARE_PER_REQUEST_CAP_TOKENS", "none")
    cfg = PolicyConfig()
    assert cfg.lookahead == 16 and cfg.per_request_cap_tokens is None
