package coordinator_test

import (
	"math"
	"testing"

	"github.com/idemkit/idempotency/coordinator"
)

func TestFingerprintIsCanonical(t *testing.T) {
	type req struct {
		B int    `json:"b"`
		A string `json:"a"`
	}
	mustFP := func(v ...any) string {
		t.Helper()
		fp, err := coordinator.Fingerprint(v...)
		if err != nil {
			t.Fatal(err)
		}
		return fp
	}
	same := [][2]string{
		{mustFP(map[string]any{"a": 1, "b": "x"}), mustFP(map[string]any{"b": "x", "a": 1})},
		{mustFP(req{A: "x", B: 1}), mustFP(map[string]any{"a": "x", "b": 1})},
		{mustFP(1.0), mustFP(1)},
		{mustFP("<&>"), mustFP("<&>")},
	}
	for i, p := range same {
		if p[0] != p[1] {
			t.Errorf("pair %d differs: %s vs %s", i, p[0], p[1])
		}
	}
	differ := [][2]string{
		{mustFP("a", "b"), mustFP("ab")},
		{mustFP([]int(nil)), mustFP([]int{})},
		{mustFP(1), mustFP("1")},
		{mustFP(map[string]int{"amount": 100}), mustFP(map[string]int{"amount": 101})},
	}
	for i, p := range differ {
		if p[0] == p[1] {
			t.Errorf("pair %d is equal: %s", i, p[0])
		}
	}
	// A known vector pins the encoding across versions and platforms:
	// sha256(`[{"a":"<&>","b":1.5},7,"é"]`).
	got := mustFP(map[string]any{"b": 1.5, "a": "<&>"}, 7, "é")
	const want = "e38babf9be3b722b485063dd02b46f5ff6c180ae3df24a4edb3635c742ff4370"
	if got != want {
		t.Fatalf("fingerprint = %s, want %s", got, want)
	}
}

func TestFingerprintRefusesWhatJSONCannotEncode(t *testing.T) {
	for _, v := range []any{math.NaN(), make(chan int), func() {}} {
		if _, err := coordinator.Fingerprint(v); err == nil {
			t.Errorf("Fingerprint(%T) did not fail", v)
		}
	}
}

func TestFingerprintIsAValidCallFingerprint(t *testing.T) {
	f, _ := newMem(t)
	fp, err := coordinator.Fingerprint("POST", "/payments", map[string]int{"amount": 1999})
	if err != nil {
		t.Fatal(err)
	}
	c := call("fp")
	c.Fingerprint = fp
	var k counter
	if _, err := coordinator.Do(t.Context(), f.c, c, k.action("x")); err != nil {
		t.Fatal(err)
	}
}
