package idemhttp

import (
	"errors"
	"strings"

	"github.com/idemkit/idempotency/coordinator"
)

// The header names the middleware speaks.
const (
	// KeyHeader is the request header that carries the idempotency key.
	KeyHeader = "Idempotency-Key"
	// ReplayedHeader is set to "true" on every replayed response, as Stripe
	// does.
	ReplayedHeader = "Idempotent-Replayed"
)

// parseKey returns the key in an Idempotency-Key header value: an RFC 8941
// sf-string (a quoted string in which only \" and \\ are escapes), with
// optional RFC 8941 parameters after it, which are checked and ignored; or,
// as many clients send it, the raw key. Either way the key must satisfy
// coordinator.ValidateKey, so `"abc"`, `"abc";v=1` and abc are the same key.
func parseKey(v string) (string, error) {
	if !strings.HasPrefix(v, `"`) {
		return v, coordinator.ValidateKey(v)
	}
	k, rest, err := parseString(v)
	if err != nil {
		return "", err
	}
	if err := checkParams(rest); err != nil {
		return "", err
	}
	return k, coordinator.ValidateKey(k)
}

// parseString parses the sf-string at the start of s (s[0] is '"') and
// returns its value and what follows it.
func parseString(s string) (value, rest string, err error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			i++
			if i == len(s) || s[i] != '"' && s[i] != '\\' {
				return "", "", errors.New(`a backslash in a quoted string must escape " or \`)
			}
			b.WriteByte(s[i])
		case c == '"':
			return b.String(), s[i+1:], nil
		case c < 0x20 || c > 0x7e:
			return "", "", errors.New("a quoted string may contain only printable ASCII")
		default:
			b.WriteByte(c)
		}
	}
	return "", "", errors.New("a quoted string has no closing quote")
}

// checkParams checks that s is RFC 8941 parameters (section 3.1.2): any
// number of ";" *SP key [ "=" bare-item ].
func checkParams(s string) error {
	for s != "" {
		if s[0] != ';' {
			return errors.New("the quoted key is followed by characters that are not parameters")
		}
		s = strings.TrimLeft(s[1:], " ")
		n := 0
		for n < len(s) && (isLCAlpha(s[n]) || s[n] == '*' || n > 0 && (isDigit(s[n]) || strings.IndexByte("_-.", s[n]) >= 0)) {
			n++
		}
		if n == 0 {
			return errors.New("a parameter after the quoted key has no valid name")
		}
		s = s[n:]
		if !strings.HasPrefix(s, "=") {
			continue
		}
		var err error
		if s, err = skipBareItem(s[1:]); err != nil {
			return err
		}
	}
	return nil
}

// skipBareItem checks the RFC 8941 bare item (integer, decimal, string,
// token, byte sequence or boolean) at the start of s and returns what follows
// it.
func skipBareItem(s string) (string, error) {
	bad := errors.New("a parameter after the quoted key has an invalid value")
	switch {
	case s == "":
		return "", bad
	case s[0] == '"':
		_, rest, err := parseString(s)
		return rest, err
	case s[0] == '?':
		if len(s) < 2 || s[1] != '0' && s[1] != '1' {
			return "", bad
		}
		return s[2:], nil
	case s[0] == ':':
		end := strings.IndexByte(s[1:], ':') + 1
		if end == 0 || strings.Trim(s[1:end], base64Chars) != "" {
			return "", bad
		}
		return s[end+1:], nil
	case s[0] == '-' || isDigit(s[0]):
		i := 0
		if s[0] == '-' {
			i++
		}
		start, dot := i, -1
		for ; i < len(s) && (isDigit(s[i]) || s[i] == '.' && dot < 0); i++ {
			if s[i] == '.' {
				dot = i
			}
		}
		switch {
		case i == start || !isDigit(s[start]) || dot == i-1: // no leading digit, or a trailing dot
			return "", bad
		case dot < 0 && i-start > 15, dot >= 0 && (dot-start > 12 || i-dot-1 > 3):
			return "", bad
		}
		return s[i:], nil
	case isAlpha(s[0]) || s[0] == '*':
		i := 1
		for i < len(s) && (isTChar(s[i]) || s[i] == ':' || s[i] == '/') {
			i++
		}
		return s[i:], nil
	}
	return "", bad
}

// base64Chars are the characters of a byte sequence (RFC 8941 section 3.3.5).
const base64Chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="

func isLCAlpha(c byte) bool { return 'a' <= c && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || 'A' <= c && c <= 'Z' }
func isDigit(c byte) bool   { return '0' <= c && c <= '9' }

// isTChar reports whether c is an RFC 9110 tchar.
func isTChar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
