package main

import (
	"net/url"
	"strings"
)

// This file mirrors the masking of the password in IDEMPOTENCY_REDIS_URL that
// the root package uses in Settings.String (redactURL, userinfo,
// authorityStart in settings.go), which it does not export.

// redactURL returns raw with its password replaced by "xxxxx". A URL that
// does not parse, or whose user information cannot be told apart from the
// rest (a '/', '?' or '#' before its last '@'), is not shown at all: there is
// no telling where its password is.
func redactURL(raw string) string {
	info, clear := userinfo(raw)
	u, err := url.Parse(raw)
	if err != nil || info != "" && !clear {
		return "(invalid URL, not shown)"
	}
	return u.Redacted()
}

// userinfo returns the bytes of raw between "scheme://" and its last '@',
// or "" when raw has no '@'. clear reports whether url.Parse reads exactly
// those bytes as the user information.
func userinfo(raw string) (info string, clear bool) {
	at := strings.LastIndexByte(raw, '@')
	if at < 0 {
		return "", true
	}
	start := authorityStart(raw)
	if start > at {
		start = 0
	}
	info = raw[start:at]
	return info, start > 0 && !strings.ContainsAny(info, "/?#")
}

// authorityStart returns the index after "scheme://" at the start of raw, as
// url.Parse reads a scheme ([A-Za-z][A-Za-z0-9+.-]*), or 0.
func authorityStart(raw string) int {
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		case i > 0 && c == ':' && strings.HasPrefix(raw[i:], "://"):
			return i + len("://")
		default:
			return 0
		}
	}
	return 0
}
