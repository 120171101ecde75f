"""Print the resolved versions of the libraries whose behaviour the test suite depends on.

The README's test command (and so .ci/run) runs it between the install and the tests, so a CI log or
a user's run says which stack it tested: the pins are in constraints.txt, and a difference between
two machines shows in the first lines of their logs (issue 35).
"""

from __future__ import annotations

from importlib import metadata

PACKAGES = ("torch", "transformers", "peft", "bitsandbytes", "trl", "accelerate", "torchao", "huggingface_hub",
            "pydantic", "mkdocs-material")


def main() -> None:
    found = []
    for name in PACKAGES:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    print("versions: " + ", ".join(found))


if __name__ == "__main__":
    main()
