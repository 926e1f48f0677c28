"""Tenants: whom each request is billed to. `tenancy` names a request's tenant (its API key's, else the `X-Tenant`
header, else `user`, else the default one); `key_table` is the table of API keys, each naming its tenant, weight and
limit. The engine shares its passes among tenants, the router limits each one's queue (`routing.tenant_limits`), and
the metrics count each one's tokens and sheds."""
