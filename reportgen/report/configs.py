"""The "TRL, Axolotl, LLaMA-Factory, torchtune and unsloth configs" page: what ``--from`` (and ``--launch``, an accelerate
config) makes of every key, from the same table the
CLI reports with (``reportgen.configs.table``), the tools' pinned versions and key counts from
``keys.json``, and a worked example written by ``reportgen.configs.reverse``. Nothing estimated.
"""

from __future__ import annotations

from reportgen.configs import reverse, table
from reportgen.report.page import Page, SiteData
from reportgen.setup import TrainingSetup

PATH = "configs.md"
#: the worked example of the reverse mapping (the consumer sweep's QLoRA setup on an 8B model)
EXAMPLE_MODEL = "llama-3.1-8b"
EXAMPLE_SETUP = TrainingSetup(method="qlora", precision="bf16-mixed", grad_ckpt=True, batch=1, seq=2048,
                              lora_rank=16, lora_targets="all-linear")


def _tool(tool: str) -> dict:
    rows = table.rows(tool)
    schema = table.schema()[tool]
    named = {r.key for r in rows}
    return {"key": tool, "name": table.TOOLS[tool], "version": schema["version"],
            "transformers": schema.get("transformers"), "trl": table.version("trl"),
            "rows": [{"key": r.key, "status": r.status, "fields": r.fields, "note": r.note,
                      "affects": r.affects} for r in rows],
            "others": len(set(table.known_keys(tool) if tool == "unsloth" else schema["keys"]) - named)}


def config_pages(site: SiteData) -> list[Page]:
    writers = (("TRL", reverse.trl_keys), ("Axolotl", reverse.axolotl_keys), ("LLaMA-Factory", reverse.llamafactory_keys),
               ("torchtune", reverse.torchtune_keys))
    keys = [(name, write(EXAMPLE_MODEL, EXAMPLE_SETUP)) for name, write in writers]
    context = {
        "tools": [_tool("trl"), _tool("axolotl"), _tool("llamafactory"), _tool("torchtune"),
                  _tool("unsloth"), _tool("accelerate")],
        "example": {"model": EXAMPLE_MODEL, "label": EXAMPLE_SETUP.short(),
                    "tools": [{"name": name, "yaml": k.yaml(), "notes": k.notes} for name, k in keys]},
    }
    return [Page(path=PATH, template="configs.md.j2", context=context)]
