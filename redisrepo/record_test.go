package redisrepo

import (
	"bytes"
	"strings"
	"testing"

	"github.com/idemkit/idempotency/coordinator/idemstore"
)

// FuzzDecodeValue: any bytes under a key decode without a panic, to a
// record or to StateUnreadable; and a record that encodeRecord wrote decodes
// to what was written.
func FuzzDecodeValue(f *testing.F) {
	f.Add([]byte("\x02\x02\x06\x08\x00\x02\x8e\xddX=\x06y\xd6\x7f\x0a\xffresult"), "8edd583d0679d67f", "0aff", []byte("r"), true)
	f.Add([]byte("\x02\x01\x00\x03\x00\x02tokfp"), "tok", "FP", []byte(nil), false)
	f.Add([]byte(""), "", "", []byte(""), true)
	f.Fuzz(func(t *testing.T, raw []byte, token, fp string, result []byte, completed bool) {
		rec := decodeValue(bytes.Clone(raw))
		if rec.State != idemstore.StateUnreadable && rec.State != idemstore.StatePending && rec.State != idemstore.StateCompleted {
			t.Fatalf("decodeValue(%q) = state %v", raw, rec.State)
		}
		if rec.State == idemstore.StateUnreadable && (rec.Token != "" || rec.Fingerprint != "" || rec.Result != nil) {
			t.Fatalf("decodeValue(%q) = unreadable with fields %+v", raw, rec)
		}
		st := idemstore.StatePending
		if completed {
			st = idemstore.StateCompleted
		}
		v, err := encodeRecord(st, token, fp, result)
		if err != nil {
			if len(token) <= maxToken && len(fp) <= maxFingerprint {
				t.Fatalf("encodeRecord(%q, %q): %v", token, fp, err)
			}
			return
		}
		got := decodeValue(v)
		if got.State != st || got.Token != token || got.Fingerprint != fp {
			t.Fatalf("round trip of %v %q %q = %+v", st, token, fp, got)
		}
		if in := new(command).decode(v); in.State != got.State || in.Token != got.Token || in.Fingerprint != got.Fingerprint || !bytes.Equal(in.Result, got.Result) {
			t.Fatalf("decoded in a command's buffer: %+v, want %+v", in, got)
		}
		if completed && (!bytes.Equal(got.Result, result) || got.Result == nil) {
			t.Fatalf("round trip of result %q = %q", result, got.Result)
		}
		if !completed && got.Result != nil {
			t.Fatalf("pending record with result %q", got.Result)
		}
	})
}

// A command spells a record's packed token and fingerprint into its own
// buffer when they fit, and marks them used, so that what the command
// appends next does not overwrite them; when they do not fit, they get
// memory of their own.
func TestCommandDecodesIntoItsBuffer(t *testing.T) {
	token, fp := strings.Repeat("8e", 16), strings.Repeat("0a", 32)
	v, err := encodeRecord(idemstore.StatePending, token, fp, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, used := range []int{0, len(command{}.buf) - len(token) - len(fp), len(command{}.buf) - 10} {
		c := &command{used: used}
		rec := c.decode(v)
		fits := used+len(token)+len(fp) <= len(c.buf)
		if want := used + len(token) + len(fp); fits && c.used != want {
			t.Errorf("used %d: the command marked %d bytes used, want %d", used, c.used, want)
		}
		if !fits && c.used != used {
			t.Errorf("used %d: the fields did not fit, and the command marked %d used", used, c.used)
		}
		c.setToken(strings.Repeat("ff", 40)) // appends to what is free
		if rec.State != idemstore.StatePending || rec.Token != token || rec.Fingerprint != fp {
			t.Errorf("used %d: decoded %+v, want token %q and fingerprint %q", used, rec, token, fp)
		}
	}
}

func TestStoredToken(t *testing.T) {
	for token, want := range map[string]string{
		"8edd583d0679d67f": "\x8e\xddX=\x06y\xd6\x7f",
		"8EDD":             "8EDD", // not lowercase: as is
		"abc":              "abc",  // odd: as is
		"":                 "",
	} {
		if got := storedToken(token); got != want {
			t.Errorf("storedToken(%q) = %q, want %q", token, got, want)
		}
	}
}

// TestMinify: the hot scripts, sent whole after NOSCRIPT, lose their comments and indentation,
// and nothing else (the tests of Complete, Renew, Release and Watch run
// them).
func TestMinify(t *testing.T) {
	for name, h := range map[string]hotScript{"complete": completeScript, "renew": renewScript, "release": releaseScript, "watch": watchScript, "abandon": abandonScript} {
		src := h.body.(string)
		if len(src) > 1024 {
			t.Errorf("%s.lua is %d bytes, sent whole after every NOSCRIPT", name, len(src))
		}
		for line := range strings.SplitSeq(src, "\n") {
			if strings.Contains(line, "--") || strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t") {
				t.Errorf("%s.lua: line %q is not minified", name, line)
			}
		}
	}
	if got := minify("-- c\n  local a = 1\n\n\treturn a\n"); got != "local a = 1\nreturn a\n" {
		t.Errorf("minify = %q", got)
	}
}
