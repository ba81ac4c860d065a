"""The public API is small, explicit and documented."""

from __future__ import annotations

import inspect

import pytest

import jaxarena
import jaxarena.engine
import jaxarena.testing
import jaxarena.workspaces
import pallas_kernels


@pytest.mark.parametrize(
    "module", [jaxarena, jaxarena.engine, jaxarena.testing, jaxarena.workspaces, pallas_kernels]
)
def test_every_public_name_has_a_docstring(module):
    missing = []
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            if not (obj.__doc__ or "").strip():
                missing.append(name)
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith("_") or not callable(member):
                        continue
                    if not (getattr(member, "__doc__", "") or "").strip():
                        missing.append(f"{name}.{attr}")
    assert not missing, f"public names without a docstring: {missing}"


@pytest.mark.parametrize(
    "module", [jaxarena, jaxarena.engine, jaxarena.testing, jaxarena.workspaces, pallas_kernels]
)
def test_all_lists_only_existing_names(module):
    assert len(set(module.__all__)) == len(module.__all__)
    for name in module.__all__:
        assert hasattr(module, name), name
