from tests.integration.test_operator_reconcile import *
def test_dbg(operator):
    apply_pools(operator, "claude-code", "codex", "mini-swe-agent")
    operator.apply(ROOT / "examples" / "trainingrun.yaml")
    time.sleep(3)
    print(sorted(children(operator, "qwen3-8b-multiharness")))
    print(operator.get(*TR, "qwen3-8b-multiharness", namespace=NS).get("status"))
