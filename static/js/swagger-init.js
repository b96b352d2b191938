// Starts Swagger UI on /docs. A served file, not an inline script: the page's CSP allows
// scripts from this origin only. The spec URL comes from the page (data-openapi-url).
const root = document.getElementById("swagger-ui");
window.ui = SwaggerUIBundle({
  url: root.dataset.openapiUrl,
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  // The default badge sends the spec to validator.swagger.io: no outside requests.
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
