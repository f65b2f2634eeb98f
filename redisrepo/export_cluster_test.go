package redisrepo

// The retry of a resharding, for cluster_unit_test.go.
var (
	RideThrough  = rideThrough
	ClusterRetry = clusterRetry
)
