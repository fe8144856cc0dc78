"""`stickless demo`: a scripted multi-node demo, narrated scene by scene.

The scenes (`scenes`) are written once against a small cluster protocol (`cluster.DemoCluster`)
and told in each cluster's words (`narration`). Two clusters run them: routers of this process
over shared in-memory backends or one Redis (`local`: `stickless demo [--redis URL]`), and one
router actor per node of a local Ray cluster (`on_ray`: `stickless demo --ray N`). Both run the
same agent (`agent.ScriptedAgent`); `opener` holds the opener `cluster.yaml` deploys.

Only the light constants are imported here, so Ray workers importing the opener load little.
"""

from .agent import AGENT_REF, DEMO_CONFIG

__all__ = ["AGENT_REF", "DEMO_CONFIG"]
