package idemhttp

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/textproto"
	"strings"
)

// recorder is the ResponseWriter the handler of a protected request writes
// to. It buffers the response (status, header, body) so that it can be stored
// before the client sees it, and so that a handler that panics has sent
// nothing. A response that cannot be buffered goes straight to the client and
// is not stored: one whose body passes the limit, one the handler flushes
// (streaming), one whose connection the handler hijacks. Its result says why
// (response.unstorable), and the codec refuses to encode it, which keeps the
// key as not replayable.
//
// It mirrors what net/http does with the header map: the handler's map
// starts as a copy of the headers outer middleware set on the real
// ResponseWriter; the header that is sent (and stored) is a snapshot taken
// when the status is set, so later changes are not sent, except the values of
// declared trailers, which are sent as trailers after the body.
type recorder struct {
	w http.ResponseWriter
	// outer is the real ResponseWriter's header before the handler ran: what
	// middleware outside this one set.
	outer http.Header
	// header is the handler's map; it starts as a copy of outer.
	header http.Header
	// sent is the snapshot of header taken when the status was set (nil
	// before): the header the client gets.
	sent   http.Header
	status int // 0 until the handler writes the header
	body   bytes.Buffer
	max    int
	// streamed says why the response went to the client as it was written
	// ("" while it is buffered).
	streamed string
	hijacked bool
}

var (
	_ http.Flusher  = (*recorder)(nil)
	_ http.Hijacker = (*recorder)(nil)
)

func newRecorder(w http.ResponseWriter, max int) *recorder {
	outer := w.Header().Clone()
	if outer == nil {
		outer = make(http.Header)
	}
	return &recorder{w: w, outer: outer, header: outer.Clone(), max: max}
}

// Header returns the handler's header map. It starts with the headers that
// middleware outside this one set on the real ResponseWriter, as net/http's
// would, and the handler may read, add to, change or delete them.
func (rw *recorder) Header() http.Header { return rw.header }

// WriteHeader records the status and takes the snapshot of the header that
// is sent. As in net/http, a code outside 100-999 panics and a second call is
// ignored. Informational (1xx) responses are dropped: the final response is
// buffered, and an early one would escape a handler that later panics.
func (rw *recorder) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if rw.status != 0 || rw.hijacked || code < 200 {
		return
	}
	rw.status = code
	rw.sent = rw.header.Clone()
}

// Write buffers p, or sends it when the response is streamed. Crossing the
// body limit starts streaming.
func (rw *recorder) Write(p []byte) (int, error) {
	if rw.hijacked {
		return 0, http.ErrHijacked
	}
	if rw.status == 0 {
		rw.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(rw.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if rw.streamed == "" && rw.body.Len()+len(p) > rw.max {
		rw.stream(fmt.Sprintf("its body is larger than %d bytes", rw.max))
	}
	if rw.streamed != "" {
		return rw.w.Write(p)
	}
	return rw.body.Write(p)
}

// Flush sends what is buffered and streams the rest of the response: a
// handler that flushes wants its client to see the response as it is
// written, which a stored response cannot offer.
func (rw *recorder) Flush() {
	if rw.hijacked {
		return
	}
	if rw.status == 0 {
		rw.WriteHeader(http.StatusOK)
	}
	if rw.streamed == "" {
		rw.stream("the handler flushed it")
	}
	_ = http.NewResponseController(rw.w).Flush()
}

// Hijack hands the connection to the handler; nothing is stored, and the
// key is kept as not replayable.
func (rw *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(rw.w).Hijack()
	if err == nil {
		rw.hijacked = true
		rw.body.Reset()
	}
	return conn, brw, err
}

// Unwrap returns the ResponseWriter underneath, for http.ResponseController
// (deadlines, full duplex).
func (rw *recorder) Unwrap() http.ResponseWriter { return rw.w }

// stream sends the header and what is buffered, and makes later writes go
// straight to the client.
func (rw *recorder) stream(why string) {
	rw.streamed = why
	rw.sniff()
	setHeader(rw.w.Header(), rw.sent)
	rw.w.WriteHeader(rw.status)
	if rw.body.Len() > 0 {
		_, _ = rw.w.Write(rw.body.Bytes())
	}
	rw.body = bytes.Buffer{}
}

// sniff sets Content-Type in the sent header as net/http would on the first
// write, so the stored response carries the type the client saw: not when
// the header has a Content-Type (even a nil one, which suppresses it), a
// Content-Encoding or a Transfer-Encoding, nor for an empty body.
func (rw *recorder) sniff() {
	h := rw.sent
	if _, ok := h["Content-Type"]; ok || rw.body.Len() == 0 || !bodyAllowed(rw.status) {
		return
	}
	if h.Get("Content-Encoding") != "" || h.Get("Transfer-Encoding") != "" {
		return
	}
	h.Set("Content-Type", http.DetectContentType(rw.body.Bytes()))
}

// result finishes the recording once the handler has returned.
func (rw *recorder) result() *response {
	if rw.status == 0 {
		rw.WriteHeader(http.StatusOK)
		rw.status = http.StatusOK // also when hijacked, for the store policy
	}
	resp := &response{status: rw.status, header: rw.sent, outer: rw.outer}
	switch {
	case rw.hijacked:
		resp.sent, resp.unstorable = true, "the handler hijacked the connection"
		return resp
	case rw.streamed != "":
		resp.sent, resp.unstorable = true, rw.streamed
	default:
		rw.sniff()
		resp.body = rw.body.Bytes()
	}
	resp.trailer = trailers(rw.sent, rw.header)
	return resp
}

// trailers returns the trailers of a response whose header was sent and
// whose handler left final as its header map, as net/http finds them: the
// final values of the names declared in the sent Trailer header, and the
// keys of final prefixed with http.TrailerPrefix. It returns nil when there
// are none.
func trailers(sent, final http.Header) http.Header {
	var t http.Header
	add := func(k string, vs []string) {
		if t == nil {
			t = make(http.Header)
		}
		t[k] = vs
	}
	for k, vs := range final {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			add(k, vs)
		}
	}
	for _, v := range sent["Trailer"] {
		for name := range strings.SplitSeq(v, ",") {
			name = http.CanonicalHeaderKey(textproto.TrimString(name))
			if vs, ok := final[name]; ok && name != "" {
				add(name, vs)
			}
		}
	}
	return t
}

// bodyAllowed reports whether a response with status may have a body
// (RFC 9110: not 1xx, 204 or 304).
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// setHeader makes dst equal to src: keys of dst that src lacks are deleted,
// the others take src's values (nil ones included).
func setHeader(dst, src http.Header) {
	for k := range dst {
		if _, ok := src[k]; !ok {
			delete(dst, k)
		}
	}
	for k, vs := range src {
		dst[k] = vs
	}
}
