package idempotency

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idempotency/internal/redisreply"
	"github.com/idemkit/idempotency/internal/redisurl"
)

// A misconfiguration is not an outage: a Redis that answers but refuses us
// (the credentials, a permission, the database), a TLS handshake that cannot
// succeed, or a server that is not Redis will not get better by waiting, so
// Module's start-up fails on them instead of serving unprotected. Only an
// unreachable or hung server is an outage that follows
// IDEMPOTENCY_ON_STORAGE_ERROR.

// RedisMisconfiguration returns the error that stops start-up when err,
// from a call to the Redis of s (the module's start-up check, idemctl's
// first PING), shows a misconfiguration, or nil when it is an outage (or
// nothing the settings can fix). The error names the variable to change
// (IDEMPOTENCY_REDIS_URL, or the Sentinel or cluster variables when those
// are used) and the problem, and never any part of the user name or
// password: it is made of fixed words, the server's address and the
// server's own reply, and a detail that mentions the user information is
// left out. It may dial the server once more, within a second, to tell a
// TLS mismatch from an outage.
func RedisMisconfiguration(ctx context.Context, err error, s Settings) error {
	top := s.topology()
	urlVar := EnvPrefix + "_REDIS_URL"
	addrVar := urlVar
	switch top {
	case redisurl.Cluster:
		addrVar = EnvPrefix + "_REDIS_CLUSTER_ADDRS"
	case redisurl.Sentinel:
		addrVar = EnvPrefix + "_REDIS_SENTINEL_ADDRS"
	}
	credVar := urlVar
	if top == redisurl.Sentinel && s.RedisSentinelPassword != "" {
		credVar = urlVar + " or " + EnvPrefix + "_REDIS_SENTINEL_PASSWORD"
	}
	opts, perr := redisurl.Parse(s.RedisURL, top)
	if perr != nil || err == nil {
		return nil // Validate refuses the URL first
	}
	where := s.RedisAddr()
	var problem, variable, detail string
	switch kind := redisRefusal(err); kind {
	case refusedCredentials:
		variable, problem, detail = credVar, "redis at %s refused the credentials (check the user name and password)", err.Error()
	case refusedPermission:
		variable, problem, detail = credVar, "redis at %s denied the user a permission the store needs (its ACL must allow the store's commands and scripts on its keys)", err.Error()
	case refusedDatabase:
		variable, problem, detail = urlVar, "redis at %s has no database "+strconv.Itoa(opts.DB)+" (its databases setting is lower)", err.Error()
	case refusedTLS:
		variable, problem, detail = urlVar, "the TLS handshake with %s failed", err.Error()
	case refusedNotRedis:
		// The foreign server's reply is not shown: it might echo what we
		// sent, the credentials included.
		variable, problem = addrVar, "the server at %s does not speak the Redis protocol (is this the Redis port?)"
	case refusedNone:
		if top == redisurl.Sentinel && errors.Is(err, redis.Nil) {
			// go-redis joins each sentinel's error; redis.Nil is the
			// answer of one that monitors no master of that name.
			variable = EnvPrefix + "_REDIS_SENTINEL_MASTER"
			problem = "no sentinel that answered (of " + strings.Join(s.RedisSentinelAddrs, ",") + ") monitors a master named " +
				strconv.Quote(s.RedisSentinelMaster) + ": check the name against the sentinels' configuration"
			break
		}
		if top != redisurl.Server {
			return nil
		}
		problem = tlsMismatch(ctx, err, opts)
		if problem == "" {
			return nil
		}
		variable = urlVar
	}
	if detail != "" {
		if info, _ := redisurl.Userinfo(s.RedisURL); info != "" && redisurl.Mentions(detail, info) ||
			s.RedisSentinelPassword != "" && redisurl.Mentions(detail, s.RedisSentinelPassword) {
			detail = ""
		}
	}
	problem = strings.Replace(problem, "%s", where, 1)
	if detail != "" {
		return fmt.Errorf("%s: %s: %s", variable, problem, detail)
	}
	return fmt.Errorf("%s: %s", variable, problem)
}

// refusal says how a Redis that could be reached refused a call; see
// redisRefusal.
type refusal string

// The kinds of refusal redisRefusal tells apart. Each is a
// misconfiguration, which waiting does not mend.
const (
	// refusedNone: err is no refusal (nil, a timeout, an unreachable
	// server, or another reply of Redis).
	refusedNone refusal = ""
	// refusedCredentials: WRONGPASS or NOAUTH, a wrong or missing user
	// name or password.
	refusedCredentials refusal = "credentials"
	// refusedPermission: NOPERM, an ACL user that may not run a command or
	// touch a key.
	refusedPermission refusal = "permission"
	// refusedDatabase: the database of the URL does not exist.
	refusedDatabase refusal = "database"
	// refusedTLS: the TLS handshake failed (the certificate, the version,
	// or a server that does not speak TLS where rediss:// expects it).
	refusedTLS refusal = "tls"
	// refusedNotRedis: the server's reply is not the Redis protocol.
	refusedNotRedis refusal = "not redis"
)

// redisRefusal reports how err, returned by a go-redis call, shows a
// misconfiguration rather than an outage, or refusedNone. It looks at
// go-redis's error replies by their codes (redisreply.Refusal, which the
// store and the observability package share), at crypto/tls's and
// crypto/x509's errors, and at go-redis's protocol errors ("redis: invalid
// reply", "redis: can't parse").
func redisRefusal(err error) refusal {
	if err == nil {
		return refusedNone
	}
	switch redisreply.Refusal(err) {
	case redisreply.Credentials:
		return refusedCredentials
	case redisreply.Permission:
		return refusedPermission
	case redisreply.Database:
		return refusedDatabase
	}
	var re redis.Error
	if errors.As(err, &re) {
		return refusedNone
	}
	var (
		certErr   *tls.CertificateVerificationError
		recordErr tls.RecordHeaderError
		alertErr  tls.AlertError
		unknownCA x509.UnknownAuthorityError
		hostErr   x509.HostnameError
		invalid   x509.CertificateInvalidError
	)
	switch {
	case errors.As(err, &certErr), errors.As(err, &recordErr), errors.As(err, &alertErr),
		errors.As(err, &unknownCA), errors.As(err, &hostErr), errors.As(err, &invalid):
		return refusedTLS
	}
	msg := err.Error()
	if strings.Contains(msg, "redis: invalid reply") || strings.Contains(msg, "redis: can't parse") {
		return refusedNotRedis
	}
	return refusedNone
}

// tlsProbeTimeout bounds the start-up probe that tells a TLS mismatch from
// an outage.
const tlsProbeTimeout = time.Second

// tlsMismatch tells a TLS mismatch from an outage, for an error that looks
// like one: a plain client whose connection a TLS server closed (EOF,
// reset, or a timeout: go-redis's retries of the closed connection can
// outlast a short PING's deadline) or a TLS client whose handshake a plain
// server never answered (a timeout). It dials the server once the other
// way, and returns the problem when that way works, else "".
func tlsMismatch(ctx context.Context, err error, opts *redis.Options) string {
	closed := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
	timedOut := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ETIMEDOUT)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		timedOut = true
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tlsProbeTimeout)
	defer cancel()
	switch {
	case opts.TLSConfig == nil && (closed || timedOut):
		d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // a probe: nothing is sent
		conn, err := d.DialContext(ctx, "tcp", opts.Addr)
		if err != nil {
			return ""
		}
		_ = conn.Close()
		return "the server at %s speaks TLS only: use rediss://"
	case opts.TLSConfig != nil && timedOut:
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", opts.Addr)
		if err != nil {
			return ""
		}
		defer conn.Close()
		if dl, ok := ctx.Deadline(); ok {
			_ = conn.SetDeadline(dl)
		}
		// An inline PING, which any Redis answers, authenticated or not:
		// +PONG, or an error reply (-NOAUTH ...).
		if _, err := conn.Write([]byte("PING\r\n")); err != nil {
			return ""
		}
		b := make([]byte, 1)
		if _, err := io.ReadFull(conn, b); err != nil || b[0] != '+' && b[0] != '-' {
			return ""
		}
		return "the server at %s does not speak TLS: use redis://, or enable TLS on the server"
	}
	return ""
}
