-- GET one path again and again. Environment: WRK_PATH, WRK_KEY, WRK_OUT, and optionally
-- WRK_ETAG (sent as If-None-Match: a conditional request).
local headers = { ["Authorization"] = "Bearer " .. os.getenv("WRK_KEY") }
local etag = os.getenv("WRK_ETAG")
if etag and etag ~= "" then headers["If-None-Match"] = etag end
local path = os.getenv("WRK_PATH")

request = function()
  return wrk.format("GET", path, headers)
end

done = function(summary, latency, requests)
  local f = io.open(os.getenv("WRK_OUT"), "w")
  f:write(string.format(
    '{"requests":%d,"duration_us":%d,"non_2xx":%d,"socket_errors":%d,"bytes":%d,' ..
    '"p50_ms":%.3f,"p90_ms":%.3f,"p99_ms":%.3f,"max_ms":%.3f,"mean_ms":%.3f}',
    summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.bytes,
    latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000, latency.mean / 1000))
  f:close()
end
