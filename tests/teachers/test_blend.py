"""pipeline.teachers.blend: the teacher's probabilities of the competition's classes, and the blend."""

import numpy as np
import pytest

from pipeline.teachers.blend import blend, fit_unknown_logit, teacher_probabilities

NAN = np.nan


def test_the_unknown_logit_separates_the_classes_the_teacher_lacks():
    # Classes 0 and 1 are known; class 2 is not. Known files score 3..5 on their own class; the lacking
    # class's files score at most 0.5 on anything the teacher knows.
    logits = np.array([[4.0, -3, NAN], [-2, 3.0, NAN], [5.0, 1.0, NAN], [0.5, -1, NAN], [-4, -0.5, NAN]])
    truth = np.array([0, 1, 0, 2, 2])
    known = np.array([True, True, False])
    value = fit_unknown_logit(np.nan_to_num(logits, nan=-99), truth, known)
    assert 0.5 < value <= 3.0  # anywhere between the two groups is right: the middle of the plateau
    assert value == pytest.approx((0.75 + 3.0) / 2)
    assert fit_unknown_logit(logits, truth, np.array([True, True, True])) is None  # knows every class
    assert fit_unknown_logit(logits, np.array([0, 1, 0, 1, 0]), known) is None  # no file of a lacking class


def test_one_label_rows_give_the_unknown_share_to_the_lacking_classes_as_the_model_splits_them():
    model = np.array([[0.2, 0.2, 0.45, 0.15], [0.7, 0.1, 0.1, 0.1]])
    logits = np.array([[-3.0, -3.0, NAN, NAN], [4.0, -2.0, NAN, NAN]])
    taught = teacher_probabilities(logits, model, independent=False, unknown_logit=0.0)
    np.testing.assert_allclose(taught.sum(axis=1), 1.0)
    z = np.exp([-3.0, -3.0, 0.0])
    np.testing.assert_allclose(taught[0], [z[0] / z.sum(), z[1] / z.sum(), z[2] / z.sum() * 0.75,
                                           z[2] / z.sum() * 0.25])  # fmt: skip
    assert taught[1].argmax() == 0 and taught[1, 0] > 0.9
    # Without an unknown logit (no class lacking), a softmax over the known classes.
    full = teacher_probabilities(np.array([[1.0, 2.0]]), np.array([[0.5, 0.5]]), False, None)
    np.testing.assert_allclose(full, [[1 / (1 + np.e), np.e / (1 + np.e)]])


def test_independent_rows_keep_the_models_probability_of_a_class_the_teacher_lacks():
    model = np.array([[0.3, 0.6], [0.2, 0.9]])
    logits = np.array([[0.0, NAN], [NAN, NAN]])  # row 1: not scored
    taught = teacher_probabilities(logits, model, independent=True, unknown_logit=None)
    np.testing.assert_allclose(taught[0], [0.5, 0.6])
    assert np.isnan(taught[1]).all()
    mixed = blend(model, taught, 0.5)
    np.testing.assert_allclose(mixed, [[0.4, 0.6], [0.2, 0.9]])  # the unscored row keeps the model's
