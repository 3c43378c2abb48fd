"""One parser for the GPU lists of ``--shareable-gpus`` and ``--dynamic-mig-gpus``; each
flag keeps its own error type and is named in the message."""

from __future__ import annotations

import pytest

from gpudra.driver.gpu_list import GpuList, parse_gpu_list
from gpudra.driver.gpu_shares import ALL, NONE, ShareableError, ShareableGpus, parse_shareable
from gpudra.driver.mig_offer import MigOfferError, parse_offer


@pytest.mark.parametrize(("text", "expected"), [
    (None, GpuList()), ("", GpuList()), (" None ", GpuList()), ("ALL", GpuList(every=True)),
    ("0, 2,GPU-ab,gpu-cd", GpuList(minors=frozenset({0, 2}),
                                   uuids=frozenset({"GPU-ab", "gpu-cd"}))),
])
def test_a_list_is_all_none_or_minors_and_uuids(text, expected):
    assert parse_gpu_list(text, "--x", ValueError) == expected


@pytest.mark.parametrize("text", ["0,gpu0", "GPU-", "1,,2", "-1"])
def test_an_item_that_names_no_gpu_is_refused_with_the_flag(text):
    with pytest.raises(ShareableError, match=r"^--shareable-gpus: '.*' is not a GPU minor"):
        parse_shareable(text)
    with pytest.raises(MigOfferError, match=r"^--dynamic-mig-gpus: '.*' is not a GPU minor"):
        parse_offer(text, None, None)


def test_both_flags_read_the_same_list_the_same_way():
    assert parse_shareable("all") is ALL and parse_shareable("none") is NONE
    assert parse_shareable("1,GPU-aa") == ShareableGpus(minors=frozenset({1}),
                                                        uuids=frozenset({"GPU-aa"}))
    offer = parse_offer("1,GPU-aa", None, None)
    assert (offer.every_gpu, offer.minors, offer.uuids) == (False, frozenset({1}),
                                                            frozenset({"GPU-aa"}))
    assert parse_offer("all", None, None).every_gpu
