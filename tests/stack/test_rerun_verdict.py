"""`dart replay decision`'s verdict (pure: no run needed): a sampled decision passes only when the
seeded re-sampling gives the logged text; an imported step was never sampled and is named so."""

from dart.replay.steps import DecisionReplay


def replay(same: str, imported_from: str = "") -> DecisionReplay:
    return DecisionReplay("r1", 0, 0, "click(start_box='(1,2)')", same, "click(start_box='(3,4)')", 1e-6, 9, True,
                          imported_from=imported_from)


def test_a_sampled_decision_passes_only_when_the_seeded_resample_is_the_logged_text():
    same, other = replay("click(start_box='(1,2)')"), replay("click(start_box='(5,6)')")
    assert (same.reproduced, other.reproduced) == (True, False)
    assert "IDENTICAL" in same.text() and "DIFFERS" in other.text()


def test_an_imported_step_is_named_as_imported_and_is_not_a_failed_reproduction():
    oracle = replay("click(start_box='(5,6)')", imported_from="oracle")
    assert oracle.reproduced and not oracle.identical
    assert "not sampled: imported from oracle" in oracle.text() and "DIFFERS" not in oracle.text()
