"""Which engine serves which model alias: built from deployment rows, swapped without restart."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from laneway.engines.base import Engine, EngineError, system_prompt_chat
from laneway.engines.kinds import build_engine, find_engine_kind
from laneway.types import DeploymentSpec

log = logging.getLogger("laneway.engines")


class UnknownModel(LookupError):
    pass


class NotServed(LookupError):
    """The alias exists, but none of its deployments serves this kind of request (embeddings
    from a model that only generates, or text from an embeddings-only one)."""


class EngineStartError(EngineError):
    """A deployment that could not start (or warm up): its name and the engine's reason."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"deployment {name}: {reason}")
        self.name = name
        self.reason = reason


@dataclass(eq=False)
class LiveDeployment:
    spec: DeploymentSpec
    engine: Engine
    outstanding: int = 0  # requests admitted to this deployment and not yet finished
    healthy: bool = True  # False: ejected from routing until a health check passes
    failures: int = 0  # consecutive engine errors
    # Back from ejection on a passing health check, not yet proven by a request: it takes one
    # request at a time until one succeeds (a /health that answers while generation still fails
    # would otherwise take a burst of requests that all fail).
    probing: bool = False
    # Drained by an admin: routing gives it no new request; those it runs finish (spec.draining,
    # applied in place by sync: the engine is not restarted for it).
    draining: bool = False
    # Answers it failed mid-answer that another replica continued (core/pipeline/attempts.py),
    # since it started here: the alias page shows it beside its health.
    continued: int = 0
    # Its role in the alias (spec.role, weight and sample, applied in place by sync like
    # draining; weight set to 0 here at once by an automatic rollback): core/canary/.
    role: str = "serving"
    weight: float = 0.0
    sample: float = 0.0

    @property
    def overloaded(self) -> bool:
        return bool(getattr(self.engine, "overloaded", False))

    @property
    def shared(self) -> bool:
        """An engine outside this process, which other gateway replicas may front too: its slots
        are shared through Redis when there is one (config "shared_slots": false opts out)."""
        kind = find_engine_kind(self.spec.engine_kind)
        return kind is not None and kind.remote and bool(self.spec.config.get("shared_slots", True))


EJECT_AFTER_FAILURES = 3


class EngineRegistry:
    """Live changes (load, sync, swap, install) are serialised by one lock: two overlapping
    syncs (a NOTIFY, the poller, an admin edit) never start two sets of engines for an alias;
    the second sees what the first installed."""

    def __init__(self) -> None:
        self._by_alias: dict[str, list[LiveDeployment]] = {}
        self.failed: dict[str, str] = {}  # deployment name -> why it could not start
        self.rejected: dict[str, str] = {}  # live edits that could not start (old engines kept)
        self._logged_failure: dict[str, str] = {}  # deployment -> the start failure last logged at ERROR
        self.warm: set[str] = set()  # deployments whose warm-up has finished
        self._retiring: set[asyncio.Task[None]] = set()
        self._changing = asyncio.Lock()

    async def load(self, specs: Sequence[DeploymentSpec]) -> None:
        async with self._changing:
            for d in await self._start_all(specs):
                self._by_alias.setdefault(d.spec.alias, []).append(d)

    async def _start_one(self, spec: DeploymentSpec) -> LiveDeployment:
        try:
            engine = build_engine(spec)
        except KeyError as exc:
            raise EngineError(f"{spec.engine_kind} needs config key {exc.args[0]!r}") from exc
        await engine.start()
        live = LiveDeployment(spec=spec, engine=engine, draining=spec.draining)
        live.role, live.weight, live.sample = spec.role, spec.weight, spec.sample
        return live

    async def _start_all(self, specs: Sequence[DeploymentSpec]) -> list[LiveDeployment]:
        started = []
        for spec in specs:
            try:
                d = await self._start_one(spec)
            except Exception as exc:
                # Every sync retries a deployment that is down: one ERROR line per new reason, not one a poll.
                reason = str(exc)
                repeated = self._logged_failure.get(spec.name) == reason
                log.log(
                    logging.DEBUG if repeated else logging.ERROR,
                    "deployment %s (%s) failed to start: %s",
                    spec.name,
                    spec.engine_kind,
                    reason,
                )
                self._logged_failure[spec.name] = reason
                self.failed[spec.name] = reason
                continue
            self.failed.pop(spec.name, None)
            self._logged_failure.pop(spec.name, None)
            started.append(d)
            log.info("deployment %s serves %s via %s", spec.name, spec.alias, spec.engine_kind)
        return started

    async def start(self, specs: Sequence[DeploymentSpec]) -> list[LiveDeployment]:
        """Start and warm up `specs` without serving them (see install). All or nothing: the
        first that fails raises EngineStartError after the started ones are closed. Nothing
        is recorded in `failed`: a refused edit does not make this replica unready."""
        started: list[LiveDeployment] = []
        for spec in specs:
            try:
                d = await self._start_one(spec)
            except Exception as exc:
                await self.discard(started)
                raise EngineStartError(spec.name, str(exc) or type(exc).__name__) from exc
            started.append(d)
            try:
                await d.engine.warmup(await warmup_prompts(d))
            except Exception as exc:
                await self.discard(started)
                raise EngineStartError(spec.name, f"warm-up failed: {exc}") from exc
        return started

    async def discard(self, started: Sequence[LiveDeployment]) -> None:
        """Close engines from start() that will not be installed."""
        for d in started:
            try:
                await d.engine.close()
            except Exception:
                log.exception("closing deployment %s failed", d.spec.name)

    async def install(
        self, alias: str, started: Sequence[LiveDeployment], commit: Callable[[], Awaitable[bool]]
    ) -> None:
        """Serve `alias` by `started` (from start(), already warm) instead of its current
        deployments, which finish what they serve and close. `commit` (the database write)
        runs under the registry's lock first, so no sync can read the new rows and start
        them a second time meanwhile; it returns False when the alias must not be served (a
        disabled model). If it raises, nothing changes and the started engines are closed."""
        async with self._changing:
            try:
                serve = await commit()
            except BaseException:
                await self.discard(started)
                raise
            if not serve:
                await self.discard(started)
                return
            for d in started:
                self.failed.pop(d.spec.name, None)
                self.rejected.pop(d.spec.name, None)
                self.warm.add(d.spec.name)
            self._switch(alias, list(started))

    async def sync(
        self, specs: Sequence[DeploymentSpec] | Callable[[], Awaitable[Sequence[DeploymentSpec]]]
    ) -> list[str]:
        """Make the live deployments match `specs` (the database's), alias by alias; returns
        the aliases that changed. An alias's new deployments start and warm up before they
        take traffic; the old ones finish what they are serving, then close.

        Pass a loader rather than a list when the specs come from the database: it is read
        under the registry's lock, so a poll that read the rows just before an admin's edit
        cannot apply them after that edit was installed and switch the alias back."""
        changed = []
        async with self._changing:
            wanted: dict[str, list[DeploymentSpec]] = {}
            for spec in await specs() if callable(specs) else specs:
                wanted.setdefault(spec.alias, []).append(spec)
            for alias in sorted(set(wanted) | set(self._by_alias)):
                self._drain(self._by_alias.get(alias, []), wanted.get(alias, []))
                current = [d.spec for d in self._by_alias.get(alias, [])]
                if current != wanted.get(alias, []):
                    await self._swap(alias, wanted.get(alias, []))
                    changed.append(alias)
        return changed

    @staticmethod
    def _drain(live: Sequence[LiveDeployment], specs: Sequence[DeploymentSpec]) -> None:
        """Draining is no engine change (DeploymentSpec leaves it out of equality): it is
        flipped on the running deployment, which keeps what it serves."""
        by_name = {spec.name: spec for spec in specs}
        for d in live:
            spec = by_name.get(d.spec.name)
            if spec is not None:
                d.draining, d.role, d.weight, d.sample = spec.draining, spec.role, spec.weight, spec.sample

    def set_draining(self, name: str, draining: bool) -> None:
        """Drain (or resume) the live deployment `name` at once (the admin's edit, before NOTIFY)."""
        for d in self.deployments():
            d.draining = draining if d.spec.name == name else d.draining

    async def swap(self, alias: str, specs: Sequence[DeploymentSpec]) -> None:
        async with self._changing:
            await self._swap(alias, specs)

    async def _swap(self, alias: str, specs: Sequence[DeploymentSpec]) -> None:
        # Deployments that have failed since start-up (an engine down when the gateway started)
        # stay failed, and the replica unready, until a sync starts them: the retry is no edit.
        down_since_load = {spec.name for spec in specs if spec.name in self.failed}
        logged = dict(self._logged_failure)
        fresh = await self._start_all(specs)
        if specs and not fresh:
            # None of the new engines could start: keep serving with the old ones (the next
            # sync retries) rather than turn a bad edit into an outage. The failure is
            # reported, but it does not make this replica unready: it still serves.
            for spec in specs:
                if spec.name in self.failed and spec.name not in down_since_load:
                    self.rejected[spec.name] = self.failed.pop(spec.name)
            if not down_since_load and any(self._logged_failure.get(s.name) != logged.get(s.name) for s in specs):
                log.error("model %s: no new deployment started; keeping the current ones", alias)
            return
        for d in fresh:
            await d.engine.warmup(await warmup_prompts(d))
            self.warm.add(d.spec.name)
        self._switch(alias, fresh)

    def _switch(self, alias: str, fresh: list[LiveDeployment]) -> None:
        old = self._by_alias.pop(alias, [])
        if fresh:
            self._by_alias[alias] = fresh  # one assignment: new requests see only the new engines
        log.info("model %s now served by %s", alias, [d.spec.name for d in fresh] or "nothing")
        if old:
            task = asyncio.create_task(self._retire(old), name=f"retire-{alias}")
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _retire(self, old: list[LiveDeployment], poll_s: float = 0.05) -> None:
        """Close replaced deployments once the requests they were serving have finished."""
        while any(d.outstanding for d in old):  # noqa: ASYNC110 - a plain counter; a 50 ms poll is cheap
            await asyncio.sleep(poll_s)
        for d in old:
            if d.spec.name not in {x.spec.name for x in self.deployments()}:
                self.warm.discard(d.spec.name)
            await d.engine.close()

    def record(self, deployment: LiveDeployment, ok: bool) -> None:
        """Passive health: consecutive engine errors eject a deployment from routing."""
        if ok:
            deployment.failures = 0
            deployment.probing = False
            return
        deployment.failures += 1
        if deployment.probing:  # its probe failed: out again at once
            deployment.failures = max(deployment.failures, EJECT_AFTER_FAILURES)
            deployment.probing = False
        if deployment.failures >= EJECT_AFTER_FAILURES and deployment.healthy:
            deployment.healthy = False
            log.warning("deployment %s ejected after %d consecutive errors", deployment.spec.name, deployment.failures)

    async def check_health(self) -> None:
        """Active health: ask every engine; an ejected one that answers well comes back."""
        for d in self.deployments():
            try:
                ok = await asyncio.wait_for(d.engine.health(), timeout=5)
            except Exception:
                ok = False
            if ok and not d.healthy:
                log.info("deployment %s is healthy again: probing it with one request at a time", d.spec.name)
                d.failures = 0
                d.probing = True
            elif not ok and d.healthy:
                log.warning("deployment %s failed its health check: ejected", d.spec.name)
            d.healthy = ok

    async def close(self) -> None:
        for task in list(self._retiring):
            task.cancel()
        for deployments in self._by_alias.values():
            for d in deployments:
                await d.engine.close()
        self._by_alias.clear()

    def aliases(self) -> list[str]:
        return sorted(self._by_alias)

    def replicas(self, alias: str) -> list[LiveDeployment]:
        """The alias's live deployments (none when it is not served)."""
        return list(self._by_alias.get(alias, ()))

    def deployments(self) -> list[LiveDeployment]:
        return [d for ds in self._by_alias.values() for d in ds]

    def capabilities(self, alias: str) -> frozenset[str]:
        """What some deployment of `alias` can do (resolve() routes a request to one that can)."""
        return frozenset().union(*(d.engine.info.capabilities for d in self._by_alias.get(alias, ())))

    def resolve(
        self,
        alias: str,
        lane: str | None = None,
        needs: frozenset[str] = frozenset(),
        *,
        embeddings: bool = False,
        exclude: frozenset[str] = frozenset(),
        role: str = "serving",
    ) -> LiveDeployment:
        """The deployment to serve `alias` in `lane`: one that generates text, or with
        `embeddings` one that declares the "embeddings" capability (NotServed if none does).

        Deployments list the lanes they serve in config "lanes" (none listed: every lane).
        Those dedicated to the lane come first while one has a free engine slot; beyond that
        (or without any) every deployment serving the lane competes. Among the chosen, the
        fewest outstanding requests wins (queued ones count, so a backlog is avoided).
        Ejected (unhealthy) and overloaded deployments are passed over while another can serve,
        and so are those that lack a capability the request `needs` (tools, json_schema...).
        Deployments named in `exclude` (replicas that already failed the request) never serve:
        NotServed when no other one is left. Draining ones serve only when nothing else can.
        Those of the pool `role` ("serving" or "canary") are chosen while one is left (in_pool).
        """
        candidates = self._by_alias.get(alias)
        if not candidates:
            raise UnknownModel(alias)
        if embeddings:
            candidates = [d for d in candidates if "embeddings" in d.engine.info.capabilities]
        else:
            candidates = [d for d in candidates if d.engine.info.generates]
        if exclude:
            candidates = [d for d in candidates if d.spec.name not in exclude]
        if not candidates:
            raise NotServed(alias)
        candidates = in_pool(candidates, role)
        candidates = [d for d in candidates if not d.draining] or candidates
        if needs:
            candidates = [d for d in candidates if needs <= d.engine.info.capabilities] or candidates
        candidates = [d for d in candidates if d.healthy and not (d.probing and d.outstanding)] or candidates
        candidates = [d for d in candidates if not d.overloaded] or candidates
        if lane is not None:
            candidates = [d for d in candidates if lane in d.spec.config.get("lanes", (lane,))] or candidates
            dedicated = [
                d
                for d in candidates
                if lane in d.spec.config.get("lanes", ()) and d.outstanding < d.engine.info.max_concurrency
            ]
            candidates = dedicated or candidates
        return min(candidates, key=lambda d: d.outstanding)

    async def warm_up(self) -> None:
        """Run every deployment's warm-up shapes (see warmup_prompts); ready once all are done."""
        for d in self.deployments():
            try:
                await d.engine.warmup(await warmup_prompts(d))
            except Exception as exc:
                log.error("deployment %s failed its warm-up: %s", d.spec.name, exc)
                self.failed[d.spec.name] = f"warm-up failed: {exc}"
                continue
            self.warm.add(d.spec.name)
            log.info("deployment %s is warm", d.spec.name)

    @property
    def ready(self) -> bool:
        deployments = self.deployments()
        return not self.failed and bool(deployments) and all(d.spec.name in self.warm for d in deployments)


def in_pool(replicas: Sequence[LiveDeployment], role: str) -> list[LiveDeployment]:
    """The replicas of the pool `role` that take requests; none left (a canary that failed, a
    pool emptied): the other pool's. A shadow serves no client while anything else can."""
    live = [d for d in replicas if d.role != "shadow"] or list(replicas)
    return [d for d in live if d.role == role] or live


async def warmup_prompts(d: LiveDeployment) -> list[str]:
    """Representative shapes, each run with max_tokens=1: a short prompt, a long one (half the
    context, at most 2048 tokens), and the deployment's common system prompts rendered as chat
    (config "warmup_system_prompts"), so their prefixes are hot in the engine's caches."""
    engine = d.engine
    target = min(engine.info.max_model_len // 2, 2048)
    long = " the" * target
    while target > 8 and (await engine.measure(prompt=long)).tokens > target:
        long = long[: len(long) * 3 // 4]
    prompts = ["Hello", long]
    for system in d.spec.config.get("warmup_system_prompts", ()):
        prompts.append((await engine.measure(messages=system_prompt_chat(str(system)))).text)
    return prompts
