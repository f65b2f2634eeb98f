package idempotency_test

import (
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/idemkit/idempotency"
)

// redisURLShapes are the URLs FuzzRedisURLErrorsHideThePassword puts a
// password (or, where password is false, a whole user information) into:
// valid ones and ones that fail in each place the parsers check.
var redisURLShapes = []struct {
	format   string
	password bool
}{
	{"redis://app:%s@127.0.0.1:6379/0", true},
	{"rediss://:%s@127.0.0.1:6380/1", true},
	{"redis://app:%s@127.0.0.1:6379/zero", true},               // database number
	{"redis://app:%s@127.0.0.1:6379/0?pool_size=x&db=3", true}, // a query option; db 3 on a cluster
	{"redis://app:%s@[::1", true},                              // host
	{"http://app:%s@127.0.0.1:6379", true},                     // scheme
	{"redis://%s@127.0.0.1:6379/0", false},                     // user name and password
	{"redis:%s@127.0.0.1:6379", false},                         // no //
}

// FuzzRedisURLErrorsHideThePassword puts a password into Redis URLs of every
// shape and checks that neither Settings.Validate's error nor
// NewRedisClient's (in single-server and cluster mode), nor Settings.String,
// contains three bytes in a row of it, as written or percent-decoded.
//
// An output may contain such bytes by chance, in its own words ("app" in a
// password and in the user name, "%25" in a hint): the bytes count as leaked
// only if the output for a disguised password (every letter, digit and
// non-ASCII byte replaced by another of its kind, so that the URL parses the
// same way) lacks them, and so do the fixed messages that replace a message
// that would show a part of the password (a password can make one appear by
// sharing bytes with a message it replaces: "tabuse" and "invalid database
// number").
func FuzzRedisURLErrorsHideThePassword(f *testing.F) {
	for _, seed := range []struct {
		password string
		shape    uint8
	}{
		{"p%zzss", 0}, // url.Parse: invalid URL escape "%zz"
		{"p%zzss", 8},
		{"p%zzss", 6},
		{"hunter2%4", 1},
		{"hunter2", 2},
		{"hunter2", 3},
		{"hunter2", 3 | 8},
		{"hunter2", 4},
		{"hunter2", 5},
		{"hunter2", 7},
		{"se/cret", 0}, // a '/' ends the host early
		{"1234/secret", 0},
		{"1234?secret", 0},
		{"sec#ret", 0},
		{"p@ss:w/rd", 0},
		{"pa%2Fss%40%3A", 8},
		{"database", 2},
		{"tabuse", 2}, // "tab" in "database": the fixed message, with "use" in "user name"
		{"%41%42%43%44", 0},
		{"über:geheim", 0},
	} {
		f.Add(seed.password, seed.shape)
	}
	var fixed strings.Builder // the fixed messages
	for _, raw := range []string{
		"redis://user:database@127.0.0.1:6379/x", // the reason is not shown
		"redis://user:p%zzss@127.0.0.1:6379/0",   // the escape
		"redis://user:a/b@127.0.0.1:6379/0",      // the ambiguous user information
	} {
		s := idempotency.DefaultSettings()
		s.RedisURL = raw
		fixed.WriteString(s.Validate().Error() + "\n")
	}
	f.Fuzz(func(t *testing.T, password string, shape uint8) {
		disguised := disguise(password)
		got, other := redisURLOutputs(password, shape), redisURLOutputs(disguised, shape)
		pieces := []string{password}
		if dec, err := url.PathUnescape(password); err == nil {
			pieces = append(pieces, dec)
		}
		for name, out := range got {
			for _, p := range pieces {
				for i := 0; i+3 <= len(p); i++ {
					if g := p[i : i+3]; strings.Contains(out, g) && !strings.Contains(other[name], g) && !strings.Contains(fixed.String(), g) {
						t.Fatalf("password %q in %q: %s shows %q:\n%s\n(with password %q:\n%s)",
							password, redisURLFor(password, shape), name, g, out, disguised, other[name])
					}
				}
			}
		}
	})
}

func redisURLFor(password string, shape uint8) string {
	return fmt.Sprintf(redisURLShapes[int(shape&7)%len(redisURLShapes)].format, password)
}

// redisURLOutputs returns what Validate, NewRedisClient and String say of the
// URL of shape with password; the bit 8 of shape selects cluster mode.
func redisURLOutputs(password string, shape uint8) map[string]string {
	s := idempotency.DefaultSettings()
	s.RedisURL = redisURLFor(password, shape)
	if shape&8 != 0 {
		s.RedisClusterAddrs = []string{"node-a:7000"}
	}
	out := map[string]string{}
	if err := s.Validate(); err != nil {
		out["Validate"] = err.Error()
	}
	client, err := idempotency.NewRedisClient(s)
	if err != nil {
		out["NewRedisClient"] = err.Error()
	} else {
		client.Close()
	}
	if redisURLShapes[int(shape&7)%len(redisURLShapes)].password {
		// String shows the user name, as url.URL.Redacted does.
		out["String"] = s.String()
	}
	return out
}

// disguise replaces every byte of password that is a hex letter, another
// letter, a digit or a non-ASCII byte with another of its kind, one that
// password does not use if there is one: the URL parses the same way, but
// shows other bytes wherever it shows the password.
func disguise(password string) string {
	classes := []string{"abcdef", "ABCDEF", "ghijklmnopqrstuvwxyz", "GHIJKLMNOPQRSTUVWXYZ", "0123456789"}
	var high []byte
	for b := 0x80; b <= 0xff; b++ {
		high = append(high, byte(b))
	}
	classes = append(classes, string(high))
	out := []byte(password)
	for _, class := range classes {
		sub := byte(0)
		for i := 0; i < len(class); i++ {
			if !strings.Contains(password, class[i:i+1]) {
				sub = class[i]
				break
			}
		}
		for i := range out {
			j := strings.IndexByte(class, password[i])
			if j < 0 {
				continue
			}
			if sub != 0 {
				out[i] = sub
			} else {
				out[i] = class[(j+1)%len(class)] // every one used: the next
			}
		}
	}
	return string(out)
}
