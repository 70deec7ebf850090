"""CI-native outputs of `run`, `retest`, `compare` and `history --check`, read from archived runs only: JUnit XML
(outputs.junit), a Markdown job summary (outputs.summary) and OpenMetrics text (outputs.openmetrics), each built
from the same sections (outputs.facts) and test cases (outputs.cases)."""
