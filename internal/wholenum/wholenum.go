// Package wholenum holds the one rule every IDEMPOTENCY_* integer variable
// follows, in the core and in the nested modules alike: a whole number
// written in base 10 as people write it, so that 010 is refused rather than
// read as 8 by one reader and 10 by another.
package wholenum

import "fmt"

// Decimal reports whether v is a whole number in base 10 as people write
// it: an optional sign, then 0 or digits that do not start with 0.
func Decimal(v string) bool {
	if v != "" && (v[0] == '+' || v[0] == '-') {
		v = v[1:]
	}
	if v == "" || len(v) > 1 && v[0] == '0' {
		return false
	}
	for _, c := range []byte(v) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// Problem is the error for variable name set to v, a value Decimal refuses.
func Problem(name, v string) error {
	return fmt.Errorf("%s: %q is not a decimal whole number; write it in base 10 without leading zeros or underscores, e.g. 10", name, v)
}
