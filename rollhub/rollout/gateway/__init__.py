"""The session gateway: OpenAI-compatible endpoints over the inference fleet, recorded as trajectories.

An agent program written against the OpenAI API (any framework, any language) trains with
rollhub by pointing its `base_url` at a session: `/sessions/{id}/v1`. Each session is
recorded token-exactly (the sampled ids, their behaviour log-probs and policy versions) and
exports as `Trajectory` objects when it ends. docs/gateway.md is the user's guide.

* `config`: GatewayConfig;  `errors`: OpenAI-shaped errors;  `requests`: request parsing;
* `messages`: comparing and rendering chat messages;  `sessions`: the session tree, export, metrics;
* `service`: Gateway, the calls turned into engine requests;  `replies`: response JSON and SSE;
* `rewards`: the check every reported reward passes;
* `app`: the aiohttp routes and authentication;
* `programs`: agent programs (functions or commands) as producers of groups;
* `cli`: `rollhub gateway`.
"""

from rollhub.rollout.gateway.app import build_gateway_app
from rollhub.rollout.gateway.config import GatewayConfig
from rollhub.rollout.gateway.service import Gateway
from rollhub.rollout.gateway.sessions import group_trajectories

__all__ = ["Gateway", "GatewayConfig", "build_gateway_app", "group_trajectories"]
