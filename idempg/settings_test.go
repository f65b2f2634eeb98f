package idempg_test

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/fx"

	"github.com/idemkit/idempotency"
	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idempg"
)

// The POSTGRES_* variables are checked for form, each error naming its
// variable and none showing a password; String and Redacted mask it.
func TestPostgresSettings(t *testing.T) {
	for _, tt := range []struct {
		url       string
		max, min  int32
		variables []string
	}{
		{url: "postgres://app:pw@db:5432/shop?sslmode=disable"},
		{url: "postgresql://db/shop"},
		{url: "host=db dbname=shop password='a b'"},
		{url: "mysql://app:pw@db/shop", variables: []string{"IDEMPOTENCY_POSTGRES_URL"}},
		{url: "host=db shop", variables: []string{"IDEMPOTENCY_POSTGRES_URL"}},
		{url: "postgres://app:p%zzw@db/shop", variables: []string{"IDEMPOTENCY_POSTGRES_URL"}},
		{max: -1, variables: []string{"IDEMPOTENCY_POSTGRES_MAX_CONNS"}},
		{min: -1, variables: []string{"IDEMPOTENCY_POSTGRES_MIN_CONNS"}},
		{max: 4, min: 5, variables: []string{"IDEMPOTENCY_POSTGRES_MIN_CONNS"}},
		{max: 0, min: 5},
	} {
		s := idempg.Settings{URL: tt.url, MaxConns: tt.max, MinConns: tt.min}
		err := s.Validate()
		if len(tt.variables) == 0 {
			if err != nil {
				t.Errorf("%q max %d min %d: %v", tt.url, tt.max, tt.min, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%q max %d min %d: no error, want one naming %v", tt.url, tt.max, tt.min, tt.variables)
			continue
		}
		for _, v := range tt.variables {
			if !strings.Contains(err.Error(), v+": ") {
				t.Errorf("%q: error %q does not name %s", tt.url, err, v)
			}
		}
		if strings.Contains(err.Error(), "zzw") {
			t.Errorf("%q: the error shows the password: %v", tt.url, err)
		}
	}
	for raw, want := range map[string]string{
		"postgres://app:s3cret@db/shop":                  "postgres://app:xxxxx@db/shop",
		"postgres://db/shop?password=s3cret&sslmode=off": "postgres://db/shop?password=xxxxx&sslmode=off",
		"host=db password=s3cret dbname=shop":            "host=db password=xxxxx dbname=shop",
		"host=db password = 'a s3cret' dbname=shop":      "host=db password = xxxxx dbname=shop",
	} {
		s := idempg.Settings{URL: raw}
		if got := s.Redacted().URL; got != want {
			t.Errorf("Redacted(%q) = %q, want %q", raw, got, want)
		}
		if strings.Contains(s.String(), "s3cret") {
			t.Errorf("String shows the password of %q", raw)
		}
	}
}

// A secret is masked where libpq and pgx read it, which is not always where
// net/url does ('#' or '?' in a password, sslpassword), and a string that
// libpq refuses is refused without quoting a secret, by Validate and by
// NewPool alike.
func TestPostgresSecretsWhereTheDriverReadsThem(t *testing.T) {
	for raw, want := range map[string]string{
		"postgres://app:#s3cret@db/shop":                     "postgres://app:xxxxx@db/shop",
		"postgres://app:12?s3cret@db/shop?sslmode=disable":   "postgres://app:xxxxx@db/shop?sslmode=disable",
		"postgresql://app:2024#s3cret/x@db/shop":             "(invalid connection string)",
		"postgres://app@db/shop?sslpassword=s3cret&a=b":      "postgres://app@db/shop?sslpassword=xxxxx&a=b",
		"postgres://db/shop?sslmode=disable&password=s3cret": "postgres://db/shop?sslmode=disable&password=xxxxx",
		"host=db sslpassword=s3cret dbname=shop":             "host=db sslpassword=xxxxx dbname=shop",
		"host=db password='it''s s3cret' dbname=shop":        "(invalid connection string)",
		`host=db password='it\'s s3cret' dbname=shop`:        "host=db password=xxxxx dbname=shop",
		`host=db password=s3cret\ pw`:                        "host=db password=xxxxx",
	} {
		s := idempg.Settings{URL: raw}
		if got := s.Redacted().URL; got != want {
			t.Errorf("Redacted(%q) = %q, want %q", raw, got, want)
		}
		if strings.Contains(s.String(), "s3cret") || strings.Contains(fmt.Sprint(s.Validate()), "s3cret") {
			t.Errorf("%q: String or Validate shows the secret: %v", raw, s.Validate())
		}
		if want == "(invalid connection string)" {
			continue
		}
		// The driver reads the same secret that was masked.
		cfg, err := pgconn.ParseConfig(raw)
		if err != nil {
			t.Errorf("pgx refuses %q: %v", raw, err)
			continue
		}
		if cfg.Password != "" && !strings.Contains(cfg.Password, "s3cret") {
			t.Errorf("%q: pgx reads the password %q", raw, cfg.Password)
		}
	}
	for _, raw := range []string{
		"host=db password=my s3cret dbname=shop",
		"host=db password='my s3cret",
		"host=db password = 'my s3cret",
		"postgres://app:s3%zzcret@db/shop",
		"postgres://db/shop?password=s3%zzcret",
	} {
		s := idempg.Settings{URL: raw}
		err := s.Validate()
		if err == nil || !strings.Contains(err.Error(), "IDEMPOTENCY_POSTGRES_URL: ") {
			t.Errorf("%q: Validate = %v, want an error naming IDEMPOTENCY_POSTGRES_URL", raw, err)
		}
		_, perr := idempg.NewPool(s)
		if perr == nil {
			t.Errorf("%q: NewPool accepts it", raw)
		}
		for _, shown := range []string{fmt.Sprint(err), fmt.Sprint(perr), s.String()} {
			if strings.Contains(shown, "s3") || strings.Contains(shown, "cret") {
				t.Errorf("%q: %q shows the secret", raw, shown)
			}
		}
	}
}

// LoadSettings reads the IDEMPOTENCY_POSTGRES_* variables, and names each
// one that does not parse, all at once.
func TestLoadSettings(t *testing.T) {
	for _, v := range []string{"URL", "MAX_CONNS", "MIN_CONNS", "MIGRATE"} {
		t.Setenv("IDEMPOTENCY_POSTGRES_"+v, "")
	}
	if s, err := idempg.LoadSettings(); err != nil || s != (idempg.Settings{}) {
		t.Fatalf("LoadSettings with every variable empty = %+v, %v; want the defaults", s, err)
	}
	t.Setenv("IDEMPOTENCY_POSTGRES_URL", "postgres://app:pw@db/shop")
	t.Setenv("IDEMPOTENCY_POSTGRES_MAX_CONNS", "8")
	t.Setenv("IDEMPOTENCY_POSTGRES_MIN_CONNS", "2")
	t.Setenv("IDEMPOTENCY_POSTGRES_MIGRATE", "true")
	want := idempg.Settings{URL: "postgres://app:pw@db/shop", MaxConns: 8, MinConns: 2, Migrate: true}
	if s, err := idempg.LoadSettings(); err != nil || s != want {
		t.Fatalf("LoadSettings = %+v, %v; want %+v", s, err, want)
	}
	t.Setenv("IDEMPOTENCY_POSTGRES_MAX_CONNS", "eight")
	t.Setenv("IDEMPOTENCY_POSTGRES_MIGRATE", "yes please")
	_, err := idempg.LoadSettings()
	var se *idempotency.SettingsError
	if !errors.As(err, &se) || len(se.Errs) != 2 ||
		!strings.Contains(err.Error(), "IDEMPOTENCY_POSTGRES_MAX_CONNS: \"eight\" is not a decimal whole number") ||
		!strings.Contains(err.Error(), "IDEMPOTENCY_POSTGRES_MIGRATE: \"yes please\" is not true or false") {
		t.Fatalf("LoadSettings with two bad values = %v, want a *SettingsError naming both", err)
	}
	t.Setenv("IDEMPOTENCY_POSTGRES_MIGRATE", "")
	// One rule for every IDEMPOTENCY_* integer, the core's: a leading zero
	// or another base is refused rather than read as some number.
	for _, v := range []string{"010", "0x10", "1_000", "+08"} {
		t.Setenv("IDEMPOTENCY_POSTGRES_MAX_CONNS", v)
		_, err := idempg.LoadSettings()
		if want := "IDEMPOTENCY_POSTGRES_MAX_CONNS: \"" + v + "\" is not a decimal whole number"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("LoadSettings with MAX_CONNS=%s = %v, want an error containing %q", v, err, want)
		}
	}
	t.Setenv("IDEMPOTENCY_POSTGRES_MAX_CONNS", "4294967296")
	if _, err := idempg.LoadSettings(); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("LoadSettings with MAX_CONNS=4294967296 = %v, want an out-of-range error", err)
	}
}

// Importing idempg declares its variables: the core's LoadSettings accepts
// them, and an app whose store is Redis refuses to start with one set,
// naming the module to add.
func TestVariablesAreDeclared(t *testing.T) {
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "IDEMPOTENCY_") && !strings.HasPrefix(name, "IDEMPOTENCY_TEST_") {
			t.Setenv(name, "")
			os.Unsetenv(name)
		}
	}
	t.Setenv("IDEMPOTENCY_POSTGRES_URL", "postgres://app:s3cret@db/shop")
	if _, err := idempotency.LoadSettings(); err != nil {
		t.Fatalf("the core's LoadSettings with IDEMPOTENCY_POSTGRES_URL set: %v", err)
	}
	app := fx.New(idempotency.Module, fx.NopLogger, fx.Invoke(func(*coordinator.Coordinator) {}))
	err := app.Err()
	if err == nil || !strings.Contains(err.Error(), "IDEMPOTENCY_POSTGRES_URL is set, but the app has no idempg.Module") {
		t.Fatalf("start-up without idempg.Module = %v, want it refused naming idempg.Module", err)
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("the error shows the password: %v", err)
	}
}

// docs/configuration.md's section of idempg's variables lists exactly the
// four that LoadSettings reads.
func TestVariablesAreDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## The PostgreSQL store's variables\n")
	if !ok {
		t.Fatal("docs/configuration.md has no section of idempg's variables")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var got []string
	for _, m := range regexp.MustCompile("(?m)^\\| `(IDEMPOTENCY_[A-Z_]+)` \\|").FindAllStringSubmatch(section, -1) {
		got = append(got, m[1])
	}
	want := []string{"IDEMPOTENCY_POSTGRES_URL", "IDEMPOTENCY_POSTGRES_MAX_CONNS", "IDEMPOTENCY_POSTGRES_MIN_CONNS", "IDEMPOTENCY_POSTGRES_MIGRATE"}
	if !slices.Equal(got, want) {
		t.Errorf("the section documents %v, want %v", got, want)
	}
}
