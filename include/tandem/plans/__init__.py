"""Plans, and the plan API their modules import.

A plan is ``conf/plans/<name>.yaml`` (streams, groups, outputs, policies) and one module: the
bundled plans' modules are here (``tandem.plans.<name>``); a project's own plan is
``conf/plans/<name>.py`` beside its YAML. A module declares each query as a function::

    from tandem.plans import PlanContext, query

    @query(writes="high_temps")
    def high_temps(ctx: PlanContext) -> DataFrame:
        return ctx.events("temps").where(F.col("temp") > 40)

and may define ``generator(seed) -> EventGenerator`` (sample events for ``tandem produce``, the
demo and the benches; default: events drawn from the stream declarations). The runtime adds the
quarantine query, and derives output modes, state stores and state names (see
:mod:`tandem.runtime.plan_api`). ``docs/plans.md`` is the plan author's guide.
"""

from tandem.runtime.plan_api import PlanContext, good_events, query

__all__ = ["PlanContext", "good_events", "query"]
