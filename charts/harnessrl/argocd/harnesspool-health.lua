-- Argo CD health of a harnessrl.io/HarnessPool, from its Ready condition.
local hs = {status = "Progressing", message = "waiting for the operator"}
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
for _, cond in ipairs(obj.status.conditions) do
  if cond.type == "Ready" then
    hs.message = cond.message
    if cond.status == "True" then
      hs.status = "Healthy"
    elseif cond.reason == "NotInUse" then
      -- A pool no run draws on has nothing to run: that is its healthy idle state.
      hs.status = "Healthy"
    elseif cond.reason == "ImagePullBackOff" or cond.reason == "CrashLoopBackOff" or cond.reason == "Unschedulable"
        or cond.reason == "InsufficientGPU" or cond.reason == "ConfigError" then
      hs.status = "Degraded"
    end
  end
end
return hs
