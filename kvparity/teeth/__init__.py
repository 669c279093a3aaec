"""The mutant zoo: known bugs planted in copies of the code, each of which the tests must catch."""
