"""What is checked, as plain data: scenarios and their drawing, scenario classes, profiles, stage
records, the poison value, the SPEC 8 contract and the ledger of scenarios played."""
