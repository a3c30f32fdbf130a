"""Benchmark: the step-time model against the bundled measured profiles (``make bench``; kvcost issue 16).

Prints, for the non-attention step time of every bundled profile (each tensor-parallel degree):

* **in range**: every other measured point held back and interpolated from the rest;
* **roofline, model held out**: the efficiencies refitted on the GPU's other model, then the
  held-out model's points predicted;
* **roofline, GPU held out**: the other GPU's fitted efficiencies applied to this GPU's
  datasheet figures (how a GPU without profiles, e.g. the H200, is priced).

Relative errors ``|predicted / measured − 1|``: median, P90 and max over the points.
"""

import numpy as np
import pytest

from kvcost.core.profiles import load_vidur_profile
from kvcost.core.roofline import FIT_PROFILES, FITTED_ROOFLINES, fit_roofline, log_errors, profile_points
from kvcost.core.specs import GPUS, MODELS


def _summary(errors: np.ndarray) -> str:
    return f"median {np.median(errors):6.1%}  P90 {np.percentile(errors, 90):6.1%}  max {errors.max():6.1%}"


@pytest.mark.bench
def test_step_time_model_against_the_bundled_profiles():
    print("\nnon-attention step time against the bundled Vidur profiles (relative error)")
    for gpu, models in FIT_PROFILES.items():
        other_gpu = next(g for g in FIT_PROFILES if g != gpu)
        for name in models:
            model = MODELS.get(name)
            interp = []
            for tp in (1, 2, 4, 8):
                profile = load_vidur_profile(gpu, model.profile_dir, tp)
                x, y = profile.num_tokens.astype(float), profile.total_s(model.num_layers)
                kept = np.arange(len(x)) % 2 == 0
                kept[-1] = True
                interp.append(np.abs(np.interp(x[~kept], x[kept], y[kept]) / y[~kept] - 1))
            print(f"{gpu} {name:12s} in range (every other point held back): {_summary(np.concatenate(interp))}")
            others = tuple(m for m in models if m != name)
            fit, _ = fit_roofline(gpu, others)
            held = np.exp(np.abs(log_errors(fit, GPUS.get(gpu), profile_points(gpu, (name,))))) - 1
            print(f"{gpu} {name:12s} roofline fitted on {', '.join(others)}: {_summary(held)}")
            cross = np.exp(np.abs(log_errors(FITTED_ROOFLINES[other_gpu], GPUS.get(gpu), profile_points(gpu, (name,)))))
            print(f"{gpu} {name:12s} roofline with the {other_gpu} fit: {_summary(cross - 1)}")
            assert np.median(held) < 0.25
