package wholenum

import "testing"

func TestDecimal(t *testing.T) {
	for v, want := range map[string]bool{
		"0": true, "10": true, "+10": true, "-3": true, "2147483648": true,
		"": false, "+": false, "010": false, "00": false, "0x10": false,
		"0o10": false, "0b10": false, "1_000": false, "1.5": false, " 1": false, "1e3": false,
	} {
		if got := Decimal(v); got != want {
			t.Errorf("Decimal(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestProblemNamesTheVariableAndTheValue(t *testing.T) {
	got := Problem("IDEMPOTENCY_X", "010").Error()
	want := `IDEMPOTENCY_X: "010" is not a decimal whole number; write it in base 10 without leading zeros or underscores, e.g. 10`
	if got != want {
		t.Errorf("Problem = %q, want %q", got, want)
	}
}
