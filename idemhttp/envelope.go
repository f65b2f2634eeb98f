package idemhttp

import (
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/internal/wire"
)

// response is a handler's response: recorded live, or decoded from the store.
type response struct {
	status int
	body   []byte

	// Live responses (recorded):

	// header is the header as sent: the outer middleware's headers as the
	// handler left them when it set the status.
	header http.Header
	// outer is the header outer middleware had set before the handler ran.
	outer http.Header
	// trailer holds the trailers to send after the body (nil when none).
	trailer http.Header
	// sent is set when the response already went to the client (streamed or
	// hijacked).
	sent bool
	// unstorable says why the response cannot be stored ("" when it can).
	unstorable string

	// Replayed responses (decoded from the store):

	// add holds the values the handler added to a header: a replay adds
	// them to what outer middleware set on the replaying request.
	add http.Header
	// replace holds the headers the handler replaced, suppressed (nil) or
	// removed (nil): a replay sets them in place of what outer middleware
	// set.
	replace http.Header
}

// envelopeVersion is the stored format's version. Readers ignore fields they
// do not know, so adding one is compatible; a new version is for changes old
// readers must refuse, and a refused record is replaced by a fresh run of the
// handler (the coordinator heals it), so bump it only with care.
const envelopeVersion = 1

// envelope is the first line of a stored response; the raw body follows the
// newline (wire.Frame).
//
// Only the allow-listed headers the handler set are stored, relative to the
// headers outer middleware had set before it ran (those are set again on
// every request by that middleware): Header holds the values the handler
// added to a header (the whole header when outer middleware had not set it);
// Replace holds the headers it replaced, and as null those it removed or
// suppressed (w.Header()["Content-Type"] = nil). A record without Replace,
// written before it existed, holds the handler's own headers in Header and
// replays them as added values.
type envelope struct {
	V       int                 `json:"v"`
	Status  int                 `json:"status"`
	Header  map[string][]string `json:"header,omitempty"`
	Replace map[string][]string `json:"replace,omitempty"`
}

// codec stores responses as a JSON envelope line followed by the body. Its
// Encode refuses responses that cannot be stored (streamed, hijacked, over
// the body limit), so that the coordinator reports them
// (record_validation_error), keeps the key as not replayable, so the handler
// never runs again for it, and still returns the live response; its Decode
// refuses what it cannot read, so that the coordinator heals the record.
type codec struct {
	replay map[string]bool
}

var _ coordinator.Codec[*response] = codec{}

func (c codec) Encode(r *response) ([]byte, error) {
	if r.unstorable != "" {
		return nil, fmt.Errorf("idemhttp: the response was sent but not stored: %s", r.unstorable)
	}
	add, replace := c.delta(r.outer, r.header)
	b, err := wire.Frame(envelope{V: envelopeVersion, Status: r.status, Header: add, Replace: replace}, r.body)
	if err != nil {
		return nil, fmt.Errorf("idemhttp: encode response: %w", err)
	}
	return b, nil
}

func (c codec) Decode(b []byte) (*response, error) {
	var e envelope
	body, err := wire.Unframe(b, &e)
	switch {
	case errors.Is(err, wire.ErrNoEnvelope):
		return nil, errors.New("idemhttp: stored response has no envelope")
	case err != nil:
		return nil, fmt.Errorf("idemhttp: stored response envelope: %w", err)
	}
	if e.V != envelopeVersion {
		return nil, fmt.Errorf("idemhttp: stored response has envelope version %d, want %d", e.V, envelopeVersion)
	}
	if e.Status < 200 || e.Status > 999 {
		return nil, fmt.Errorf("idemhttp: stored response has status %d", e.Status)
	}
	resp := &response{status: e.Status, body: body, add: make(http.Header), replace: make(http.Header)}
	for k, vs := range e.Header {
		if k = http.CanonicalHeaderKey(k); c.stored(k) && len(vs) > 0 {
			resp.add[k] = append(resp.add[k], vs...)
		}
	}
	for k, vs := range e.Replace {
		if k = http.CanonicalHeaderKey(k); c.stored(k) {
			resp.replace[k] = nilIfEmpty(vs)
		}
	}
	return resp, nil
}

// stored reports whether the header k (canonical) is stored and replayed. It
// is asked when storing and again when replaying, so a narrowed allow-list
// applies to records stored before, and a record never replays a forbidden
// header.
func (c codec) stored(k string) bool { return c.replay[k] && !neverReplayed(k) }

// delta returns what the handler did to the allow-listed headers, given
// outer, the header before it ran, and sent, the header it sent: add holds
// the values it appended to a header (all of them when outer lacks it),
// replace the headers it otherwise changed, nil for one it removed or set to
// nil. Headers it left as they were are in neither: outer middleware sets
// them again on every request.
func (c codec) delta(outer, sent http.Header) (add, replace map[string][]string) {
	put := func(m *map[string][]string, k string, vs []string) {
		if *m == nil {
			*m = make(map[string][]string)
		}
		(*m)[k] = vs
	}
	for k, vs := range sent {
		ck := http.CanonicalHeaderKey(k)
		if !c.stored(ck) {
			continue
		}
		was, had := outer[k]
		switch {
		case had && slices.Equal(vs, was):
		case len(vs) > len(was) && slices.Equal(vs[:len(was)], was):
			put(&add, ck, vs[len(was):])
		default:
			put(&replace, ck, nilIfEmpty(vs))
		}
	}
	for k := range outer {
		if _, ok := sent[k]; !ok && c.stored(http.CanonicalHeaderKey(k)) {
			put(&replace, http.CanonicalHeaderKey(k), nil)
		}
	}
	return add, replace
}

func nilIfEmpty(vs []string) []string {
	if len(vs) == 0 {
		return nil
	}
	return vs
}
