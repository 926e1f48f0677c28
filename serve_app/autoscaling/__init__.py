"""Serve autoscaling of the Engine deployment on the service levels, not request counts.

`signals` is what each replica publishes (`Engine.record_autoscaling_stats`: queued prefill seconds, a new chat's
predicted TTFT against its target, requests); `decision` is the pure rule from those to a replica count;
`serve_policy` is the Serve adapter named in the Engine's `autoscaling_config.policy`. Its knobs are
`serve_app.config.autoscaling.SloScalingKnobs`; the operator's view: `docs/autoscaling.md`.
"""
