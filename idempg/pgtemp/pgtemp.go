// Package pgtemp starts a throwaway PostgreSQL server: initdb into a
// temporary directory, then postgres on a free port of 127.0.0.1 with its
// unix socket in that directory. The examples start one when
// IDEMPOTENCY_POSTGRES_URL is unset, so that they run with one command, and
// a service's own demos and tests may do the same; nothing in it is a test
// helper. It can also put a PgBouncer in transaction pooling mode in front
// of the server (StartPgBouncer), and crash and restart the server (Kill,
// Restart), for fault tests.
//
// PostgreSQL refuses to run as root. When the process runs as root (as CI
// does), the server's files are given to the "postgres" user that Debian's
// postgresql package creates, and initdb and postgres run as that user
// (through the process credentials, no su or sudo needed).
//
// The binaries are looked up on PATH, then in /usr/lib/postgresql/*/bin
// (Debian's layout, newest version first). When none is found, Start returns
// an error matching ErrNotFound.
package pgtemp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNotFound is returned by Start when no PostgreSQL binaries are found.
var ErrNotFound = errors.New("pgtemp: no PostgreSQL binaries (initdb, postgres) on PATH or in /usr/lib/postgresql/*/bin; apt-get install postgresql")

// Server is a running PostgreSQL server that Start started.
type Server struct {
	// DSN connects to the server's "postgres" database as its superuser,
	// through the unix socket.
	DSN string
	// Version is the server's major version, e.g. "15".
	Version string
	// Port is the server's TCP port on 127.0.0.1, where it asks for
	// passwords (scram-sha-256); the unix socket trusts every user.
	Port int

	dir  string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// Start initialises a database cluster in a new temporary directory and
// starts postgres on it. Stop stops it and removes the directory.
func Start() (*Server, error) {
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "idempg-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgtemp: %w", err)
	}
	s := &Server{dir: dir, done: make(chan struct{}), log: filepath.Join(dir, "postgres.log")}
	if err := s.start(bin); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func (s *Server) start(bin string) error {
	cred, err := credential()
	if err != nil {
		return err
	}
	if cred != nil {
		if err := os.Chown(s.dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("pgtemp: give %s to the postgres user: %w", s.dir, err)
		}
	}
	data := filepath.Join(s.dir, "data")
	const superuser = "idempg"
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", superuser,
		// Trust on the unix socket, which the tests use; passwords over TCP,
		// for tests of a refused password.
		"--auth-local=trust", "--auth-host=scram-sha-256",
		"-E", "UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("pgtemp: initdb: %w\n%s", err, out)
	}
	v, _ := os.ReadFile(filepath.Join(data, "PG_VERSION"))
	s.Version = strings.TrimSpace(string(v))

	port, err := freePort()
	if err != nil {
		return err
	}
	logf, err := os.Create(s.log)
	if err != nil {
		return fmt.Errorf("pgtemp: %w", err)
	}
	defer logf.Close()
	s.cmd = exec.Command(filepath.Join(bin, "postgres"), "-D", data,
		"-p", strconv.Itoa(port), "-k", s.dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "max_connections=200",
		// Durability is not under test: these make the server fast on a
		// shared machine.
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	// Pdeathsig: a test binary that dies takes its server with it.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("pgtemp: start postgres: %w", err)
	}
	go func() {
		_ = s.cmd.Wait()
		close(s.done)
	}()
	s.Port = port
	s.DSN = fmt.Sprintf("host=%s port=%d user=%s dbname=postgres sslmode=disable", s.dir, port, superuser)
	return s.ready()
}

// ready waits until the server accepts a connection.
func (s *Server) ready() error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, s.DSN)
		if err == nil {
			err = conn.Ping(ctx)
			_ = conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("pgtemp: postgres exited at start-up:\n%s", s.logTail())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtemp: postgres not ready after 60s: %w\n%s", err, s.logTail())
		}
	}
}

// Stop stops the server (a fast shutdown, then SIGKILL after 10s) and
// removes its directory. It may be called on a nil Server and more than once.
func (s *Server) Stop() {
	if s == nil {
		return
	}
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	}
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// findBin returns the directory that holds initdb and postgres.
func findBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(p)
		if real, err := filepath.EvalSymlinks(p); err == nil {
			dir = filepath.Dir(real) // /usr/local/bin/initdb -> /usr/lib/postgresql/15/bin/initdb
		}
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return version(b) - version(a) })
	for _, dir := range dirs {
		_, e1 := os.Stat(filepath.Join(dir, "initdb"))
		_, e2 := os.Stat(filepath.Join(dir, "postgres"))
		if e1 == nil && e2 == nil {
			return dir, nil
		}
	}
	return "", ErrNotFound
}

// version returns the major version in a path /usr/lib/postgresql/N/bin.
func version(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// credential returns the credential to run the server with: nil when the
// tests do not run as root, the "postgres" user's otherwise.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtemp: running as root, and PostgreSQL refuses root: no user \"postgres\" to run it as (%w)", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pgtemp: user postgres: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtemp: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// CreateDatabase creates the database name on the server at dsn (as its
// superuser), dropping one of that name first.
func CreateDatabase(ctx context.Context, dsn, name string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("pgtemp: %w", err)
	}
	defer conn.Close(context.Background())
	ident := pgx.Identifier{name}.Sanitize()
	for _, sql := range []string{"DROP DATABASE IF EXISTS " + ident + " WITH (FORCE)", "CREATE DATABASE " + ident} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("pgtemp: %s: %w", sql, err)
		}
	}
	return nil
}
