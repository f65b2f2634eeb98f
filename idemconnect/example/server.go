package main

import (
	"fmt"
	"net/http"

	"connectrpc.com/connect"

	"github.com/idemkit/idempotency/coordinator"
	"github.com/idemkit/idempotency/idemconnect"
)

// newMux returns the service's routes: the handlers of the payments
// service, Charge behind the idempotency interceptor over the coordinator
// that the fx module provides.
func newMux(c *coordinator.Coordinator, p *payments) (*http.ServeMux, error) {
	idem, err := idemconnect.NewInterceptor(c,
		// Only Charge moves money; GetCharge reads and needs no key.
		idemconnect.WithProcedures(chargeProcedure),
		// A charge without a key is refused (InvalidArgument): clients must
		// be able to retry a charge safely.
		idemconnect.WithKeyRequired(true),
		// Keys are per caller: two tenants who send the same key never see
		// each other's charge. See tenantOf.
		idemconnect.WithKeyScope(tenantOf),
	)
	if err != nil {
		return nil, fmt.Errorf("idempotency interceptor: %w", err)
	}
	with := connect.WithInterceptors(idem)
	mux := http.NewServeMux()
	mux.Handle(chargeProcedure, connect.NewUnaryHandler(chargeProcedure, p.Charge, with))
	mux.Handle(getChargeProcedure, connect.NewUnaryHandler(getChargeProcedure, p.GetCharge, with))
	return mux, nil
}
