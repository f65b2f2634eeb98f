package idempg

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/idemkit/idempotency/internal/redisurl"
)

// A connection string is read here as libpq and pgx read it, not as
// net/url does: the two disagree (postgres://app:#s3cret@db/shop is a
// password "#s3cret" to libpq, a fragment to net/url), and redaction that
// reads the string otherwise than the driver shows what the driver takes
// for the password.

// span is the byte range [from, to) of one secret value in a connection
// string.
type span struct{ from, to int }

// isSecretKey reports whether a connection parameter's value is a secret:
// the password, or the passphrase of the client's TLS key.
func isSecretKey(key string) bool {
	key = strings.ToLower(key)
	return key == "password" || key == "sslpassword"
}

// isPostgresURL reports whether raw is in the URL form of a connection
// string rather than the key=value form.
func isPostgresURL(raw string) bool {
	return strings.HasPrefix(raw, "postgres://") || strings.HasPrefix(raw, "postgresql://")
}

// scanConnString returns the spans of raw's secret values and, if libpq
// would refuse raw's form, a problem that quotes none of raw's text that
// may be a secret. Empty is valid: no PostgreSQL store.
func scanConnString(raw string) ([]span, error) {
	switch {
	case raw == "":
		return nil, nil
	case strings.IndexByte(raw, 0) >= 0:
		return nil, errors.New("contains a NUL byte")
	case isPostgresURL(raw):
		return scanURL(raw)
	case strings.Contains(raw, "://"):
		return nil, errors.New("must be a postgres:// or postgresql:// URL, or a key=value connection string such as \"host=db dbname=shop\"")
	}
	return scanKeywordValue(raw)
}

// scanURL reads a postgres:// URL as libpq does: the user information ends
// at the first '@' before any '/', and the parameters follow the first '?'
// after it.
func scanURL(raw string) ([]span, error) {
	start := strings.Index(raw, "://") + len("://")
	p := raw[start:]
	var secrets []span
	if i := strings.IndexAny(p, "@/"); i >= 0 && p[i] == '@' {
		user, password, hasPassword := strings.Cut(p[:i], ":")
		if _, err := url.PathUnescape(user); err != nil {
			return nil, errors.New("the URL's user name does not decode (percent-encode its special characters)")
		}
		if hasPassword && password != "" {
			if _, err := url.PathUnescape(password); err != nil {
				return nil, errors.New("the URL's password does not decode (percent-encode its special characters)")
			}
			from := start + len(user) + 1
			secrets = append(secrets, span{from, from + len(password)})
		}
		start += i + 1
		p = raw[start:]
	}
	netloc := p
	if i := strings.IndexAny(p, "/?"); i >= 0 {
		netloc = p[:i]
	}
	for _, hostPort := range strings.Split(netloc, ",") {
		if err := checkPort(hostPort); err != nil {
			return nil, err
		}
	}
	q := strings.IndexByte(p, '?')
	if q < 0 {
		return secrets, nil
	}
	at := start + q + 1
	for _, pair := range strings.Split(raw[at:], "&") {
		key, value, found := strings.Cut(pair, "=")
		dkey, err := url.PathUnescape(key)
		switch {
		case err != nil:
			return nil, errors.New("a parameter name of the URL does not decode (percent-encode its special characters)")
		case !found:
			return nil, fmt.Errorf("the URL's parameter %q has no =", dkey)
		case isSecretKey(dkey):
			if _, err := url.PathUnescape(value); err != nil || strings.Contains(value, "=") {
				return nil, fmt.Errorf("the URL's parameter %s does not decode (percent-encode its special characters)", dkey)
			}
			from := at + len(key) + 1
			secrets = append(secrets, span{from, from + len(value)})
		case strings.Contains(value, "="):
			return nil, fmt.Errorf("the URL's parameter %q has two =", dkey)
		}
		at += len(pair) + 1
	}
	return secrets, nil
}

// checkPort checks the port of one host[:port] of a URL's host list, which
// libpq requires to be a number from 1 to 65535 when given. It quotes
// nothing: a mislaid password lands there (postgres://u:pw/x@h reads
// "pw/x@h" as the first host's port).
func checkPort(hostPort string) error {
	if strings.HasPrefix(hostPort, "[") {
		end := strings.IndexByte(hostPort, ']')
		if end < 0 {
			return errors.New("an IPv6 host of the URL has no ]")
		}
		hostPort = hostPort[end+1:]
		if hostPort != "" && hostPort[0] != ':' {
			return errors.New("an IPv6 host of the URL is followed by neither : nor /")
		}
	}
	_, port, found := strings.Cut(hostPort, ":")
	if !found || port == "" {
		return nil
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || strings.TrimLeft(port, "0123456789") != "" {
		return errors.New("a port of the URL is not a number from 1 to 65535 (a password with / must percent-encode it: %2F)")
	}
	return nil
}

// scanKeywordValue reads a key=value connection string as libpq does: a
// keyword, '=', then a value up to the next space or in single quotes, with
// backslash escapes.
func scanKeywordValue(raw string) ([]span, error) {
	var secrets []span
	prev := "" // the keyword of the pair before, for the problems
	wordAfter := func() string {
		if prev == "" {
			return "the first word"
		}
		return "the word after " + prev + "'s value"
	}
	i := skipSpace(raw, 0)
	for i < len(raw) {
		key := i
		for i < len(raw) && raw[i] != '=' && !isSpace(raw[i]) {
			i++
		}
		word := raw[key:i]
		i = skipSpace(raw, i)
		if i == len(raw) || raw[i] != '=' {
			if isSecretKey(prev) {
				return nil, fmt.Errorf("%s has no = (quote a value that has spaces: %s='a b')", wordAfter(), prev)
			}
			return nil, fmt.Errorf("must be a postgres:// URL or key=value pairs, and %s, %q, has no =", wordAfter(), word)
		}
		if word == "" {
			return nil, errors.New("a value has no keyword before its =")
		}
		i = skipSpace(raw, i+1)
		from := i
		if i < len(raw) && raw[i] == '\'' {
			for i++; i < len(raw) && raw[i] != '\''; i++ {
				if raw[i] == '\\' {
					i++
				}
			}
			if i >= len(raw) {
				return nil, fmt.Errorf("the value of %s has a ' that is not closed", word)
			}
			i++
		} else {
			for ; i < len(raw) && !isSpace(raw[i]); i++ {
				if raw[i] == '\\' {
					i++
				}
			}
			i = min(i, len(raw))
		}
		if isSecretKey(word) && i > from {
			secrets = append(secrets, span{from, i})
		}
		prev = word
		i = skipSpace(raw, i)
	}
	return secrets, nil
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

func skipSpace(s string, i int) int {
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	return i
}

// validatePostgresURL checks the form of a PostgreSQL connection string, as
// far as it can be checked without a driver: a postgres:// or postgresql://
// URL, or key=value pairs, as libpq reads them.
func validatePostgresURL(raw string) error {
	_, err := scanConnString(raw)
	return err
}

// redactPostgres returns raw with each secret value (the password, in the
// URL's user information, a parameter or a key=value pair, and
// sslpassword) replaced by "xxxxx". A string whose form libpq refuses
// becomes "(invalid connection string)": where its secrets are cannot be
// told.
func redactPostgres(raw string) string {
	secrets, err := scanConnString(raw)
	if err != nil {
		return "(invalid connection string)"
	}
	var b strings.Builder
	at := 0
	for _, s := range secrets {
		b.WriteString(raw[at:s.from])
		b.WriteString("xxxxx")
		at = s.to
	}
	b.WriteString(raw[at:])
	return b.String()
}

// mentionsSecret reports whether msg contains three bytes in a row of one
// of raw's secret values, or of raw itself when its secrets cannot be told.
func mentionsSecret(msg, raw string) bool {
	secrets, err := scanConnString(raw)
	if err != nil {
		return redisurl.Mentions(msg, raw)
	}
	for _, s := range secrets {
		if redisurl.Mentions(msg, strings.Trim(raw[s.from:s.to], "'")) {
			return true
		}
	}
	return false
}
