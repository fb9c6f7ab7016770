"""pipeline.teachers.species: the competition's classes matched to a teacher's outputs by scientific name."""

from pipeline.core.tables import read_taxonomy
from pipeline.teachers.species import match_classes, scientific_name

BIRDNET_LIKE = ("Acrocephalus palustris_Marsh Warbler", "Acrocephalus schoenobaenus_Sedge Warbler",
                "Turdus merula_Eurasian Blackbird", "Human vocal_Human vocal", "grewar3")  # fmt: skip


def test_scientific_names_are_compared_as_names():
    assert scientific_name("Acrocephalus palustris_Marsh Warbler") == "acrocephalus palustris"
    assert scientific_name("grewar3") == "grewar3"  # a code label stays itself


def test_binomial_labels_taxonomy_codes_and_exclusions(tmp_path):
    (tmp_path / "taxonomy.csv").write_text("primary_label,scientific_name,common_name\nblabir1,Turdus merula,"
                                           "Blackbird\nprpar1,Amazona vittata,Puerto Rican Parrot\n")  # fmt: skip
    taxonomy = read_taxonomy(tmp_path)
    classes = ["acrocephalus_palustris", "Acrocephalus-Schoenobaenus", "blabir1", "prpar1", "grewar3", "1139490",
               "acrocephalus_palustris_2"]  # fmt: skip
    found = match_classes(classes, BIRDNET_LIKE, taxonomy, exclude=["acrocephalus_palustris_2"])
    assert found.outputs == (0, 1, 2, -1, 4, -1, -1)
    assert found.names[2] == "Turdus merula_Eurasian Blackbird"
    assert found.known == [0, 1, 2, 4]
    assert found.lacking == {
        "prpar1": "Amazona vittata is not among the teacher's 5 outputs",
        "1139490": "no scientific name (not in taxonomy.csv, and not a binomial)",
        "acrocephalus_palustris_2": "left out of the teacher's map (teacher_exclude)",
    }
    assert "knows 4 of 7 classes; it lacks 3" in found.describe()
    assert found.as_record()["classes"]["blabir1"] == "Turdus merula_Eurasian Blackbird"
